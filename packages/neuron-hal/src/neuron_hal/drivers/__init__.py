"""Drivers shipped with neuron-hal (others register through the ``neuron_hal.drivers`` entry points)."""
