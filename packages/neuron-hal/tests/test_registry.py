import pytest

from neuron_hal import TRN3, DriverNotFoundError, driver_names, get_driver
from neuron_hal.drivers.null import NullDriver
from neuron_hal.registry import select_driver_class


def test_null_driver_is_registered_by_entry_point():
    assert "null" in driver_names()
    assert select_driver_class("null") is NullDriver


def test_env_selects_driver(monkeypatch):
    monkeypatch.setenv("NEURON_HAL_DRIVER", "null")
    assert isinstance(get_driver(), NullDriver)


def test_unknown_driver_names_installed_ones(monkeypatch):
    monkeypatch.setenv("NEURON_HAL_DRIVER", "warp")
    with pytest.raises(DriverNotFoundError, match="no neuron HAL driver 'warp'; installed: .*null"):
        get_driver()


def test_null_is_never_auto_selected(monkeypatch):
    monkeypatch.delenv("NEURON_HAL_DRIVER", raising=False)
    try:
        cls = select_driver_class()
    except DriverNotFoundError:
        return
    assert cls is not NullDriver


def test_instances_are_per_profile():
    a, b = get_driver("null", "trn2"), get_driver("null", TRN3)
    assert a is get_driver("null", "trn2") and a is not b
    assert len(b.devices()) == 8 and b.devices()[0].profile is TRN3
