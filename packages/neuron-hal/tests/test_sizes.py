"""Byte sizes from environment variables: plain numbers, exponents and K/M/G/T suffixes; errors name the variable."""

import pytest

from neuron_hal.emulated import hbm_capacity
from neuron_hal.sizes import parse_bytes


@pytest.mark.parametrize("text, value", [("65536", 65536), ("1e9", 10**9), ("64M", 64 << 20), ("64MiB", 64 << 20),
                                         ("64mb", 64 << 20), ("1.5G", 3 << 29), ("2 GiB", 2 << 30), ("512k", 512 << 10),
                                         ("1T", 1 << 40), (" 100 ", 100), ("2.7", 2)])
def test_sizes_people_write_parse(text, value):
    assert parse_bytes(text, "X") == value


@pytest.mark.parametrize("text", ["64Q", "M", "-5", "0", "0.5", "nan", "inf", "1e400", "64 M B", ""])
def test_bad_sizes_name_the_variable_and_the_forms(text):
    with pytest.raises(ValueError, match=r"NEURON_SIM_HBM_BYTES=.* is not a positive byte size: .*64M"):
        parse_bytes(text, "NEURON_SIM_HBM_BYTES")


def test_hbm_capacity_takes_a_suffixed_size_and_caps_at_the_chip(monkeypatch):
    monkeypatch.setenv("NEURON_SIM_HBM_BYTES", "64M")
    assert hbm_capacity(1 << 40) == 64 << 20
    monkeypatch.setenv("NEURON_SIM_HBM_BYTES", "2T")
    assert hbm_capacity(1 << 30) == 1 << 30
    monkeypatch.delenv("NEURON_SIM_HBM_BYTES")
    assert hbm_capacity(123) == 123
