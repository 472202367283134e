import dataclasses

import pytest

from neuron_hal import PROFILES, TRN1, TRN2, TRN3, get_profile


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_every_parameter_has_a_source(profile):
    for name, value, source in profile.describe():
        assert source and isinstance(source, str), name
        assert value is not None, name


def test_reference_figures():
    # Reference sheet §1 and §2: cores, clocks, memories, DMA.
    assert (TRN1.cores_per_chip, TRN2.cores_per_chip, TRN3.cores_per_chip) == (2, 8, 8)
    assert (TRN1.tensor_ghz, TRN2.tensor_ghz, TRN3.tensor_ghz) == (2.8, 2.4, 2.4)
    assert (TRN2.vector_ghz, TRN2.scalar_ghz, TRN2.gpsimd_ghz) == (0.96, 1.2, 1.2)
    assert TRN1.sbuf_bytes == 24 * 2**20 and TRN2.sbuf_bytes == 28 * 2**20 and TRN3.sbuf_bytes == 32 * 2**20
    assert all(p.psum_partition_bytes * 128 == 2 * 2**20 and p.psum_bank_bytes == 2048 for p in PROFILES.values())
    assert (TRN1.hbm_bytes, TRN2.hbm_bytes, TRN3.hbm_bytes) == (32 * 2**30, 96 * 2**30, 144 * 2**30)
    assert (TRN1.dma_engine_bytes_per_ns, TRN2.dma_engine_bytes_per_ns, TRN3.dma_engine_bytes_per_ns) == (17, 23, 33)
    assert TRN2.min_ii == 64 and TRN2.gpsimd_start == 150 and TRN2.mm_init_latency == 64


def test_derived_peak_matches_documented_per_core_claim():
    # 128x128 PEs x 2 FLOP x clock reproduces the per-NC BF16 claims within 1 TFLOPS (§1.1 check).
    for p in PROFILES.values():
        assert abs(p.tensor_peak_flops / 1e12 - p.tensor_bf16_tflops) < 1.0, p.name


def test_dma_bandwidth_is_capped_by_hbm_share():
    assert TRN2.dma_bytes_per_ns == pytest.approx(min(16 * 23, 2900 / 8))
    assert TRN3.dma_bytes_per_ns == pytest.approx(16 * 33)


def test_profiles_are_frozen_and_replaceable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TRN2.min_ii = 1
    assert TRN2.replace(min_ii=1).min_ii == 1 and TRN2.min_ii == 64


def test_get_profile_env(monkeypatch):
    monkeypatch.setenv("NEURON_DEVICE_PROFILE", "trn3")
    assert get_profile() is TRN3
    monkeypatch.delenv("NEURON_DEVICE_PROFILE")
    assert get_profile() is TRN2
    with pytest.raises(ValueError, match="unknown device profile 'trn9'.*trn1, trn2, trn3"):
        get_profile("trn9")


def test_unknown_source_name():
    with pytest.raises(KeyError, match="no parameter"):
        TRN2.source("warp_drive")


def test_dma_transpose_by_generation():
    # [NKI-ARCH-V3]: from NC-v3, at <= 90% (HBM -> SBUF) and <= 50% (SBUF -> SBUF) of copy throughput.
    assert not TRN1.dma_transpose and TRN2.dma_transpose and TRN3.dma_transpose
    assert (TRN2.dma_transpose_hbm_fraction, TRN2.dma_transpose_sbuf_fraction) == (0.9, 0.5)
    assert (TRN3.dma_transpose_hbm_fraction, TRN3.dma_transpose_sbuf_fraction) == (0.9, 0.5)
    assert "[NKI-ARCH-V3]" in TRN2.source("dma_transpose_hbm_fraction")
    assert "[INFERRED]" in TRN3.source("dma_transpose")
