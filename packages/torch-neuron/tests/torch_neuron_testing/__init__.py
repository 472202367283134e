"""Harness for running PyTorch's own test databases (OpInfo ``op_db``, ``module_db``, ``optim_db``) on the
``neuron`` device against the CPU.

Why a harness of our own rather than ``instantiate_device_type_tests`` with ``PrivateUse1TestBase``: the
device-type machinery builds every sample *on the device under test* (``make_tensor`` -> random fills,
factory ops), so a missing or wrong RNG / factory kernel would fail every op's test for a reason that is
not the op; it also adds a heavy per-test ``setUp`` and CUDA-centric gates. Here samples are built on the
CPU from a fixed seed, copied to ``neuron`` keeping their exact strides (non-contiguous and overlapping
views included), and the op runs on both: the inputs are bit-identical, failures belong to the op, and
the run is deterministic, so subsampling by sample index is stable. The parts of the machinery that
matter for a device-vs-CPU comparison are applied as PyTorch applies them to ``TestCommon.test_compare_cpu``:
the OpInfo's skips (random or uninitialized outputs), its tolerance/precision overrides, and its
device restrictions (``onlyCUDA`` ops are skipped).

Modules: :mod:`.transfer` (moving sample trees, comparing results, counting fallbacks), :mod:`.opinfo`,
:mod:`.modules`, :mod:`.optims` (one runner per database) and :mod:`.exclusions` (the known-failure file).
"""
