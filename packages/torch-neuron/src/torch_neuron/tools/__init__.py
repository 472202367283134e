"""torch-neuron's tools: the telemetry a process publishes (:mod:`.telemetry`) and ``neuron-profile``
(:mod:`.profile_cli`, its HTML report in :mod:`.report`)."""
