"""The autotuner: exhaustive deterministic search, skipped failing configurations, the on-disk cache (keys,
hits, concurrent writers) and the neuron-tune command line."""

import json
import multiprocessing
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_hal import DType, get_driver, get_profile
from neuron_kernels import KernelError, TensorSpec, autotune, tune_cli
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl
from neuron_kernels.autotune import best_config, configurations, record, tune

F32 = DType.float32


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> pathlib.Path:
    monkeypatch.setenv("NEURON_KERNELS_TUNE_CACHE", str(tmp_path / "tune"))
    return tmp_path / "tune"


def make_copy_kernel(version=1, choices=(64, 512, 128, 256)):
    """Copies [128, N] in column chunks: the chunk decides how many DMAs run, so timings differ."""

    @nk.kernel(name="chunked_copy", tunables={"chunk": choices, "bufs": (2, 4)}, version=version)
    def chunked_copy(x, chunk=64, bufs=2):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        for c0 in range(0, x.shape[1], chunk):
            c = min(chunk, x.shape[1] - c0)
            t = nl.ndarray((x.shape[0], chunk), x.dtype, bufs=bufs)
            nisa.dma_copy(t[:, :c], x[:, c0:c0 + c])
            nisa.dma_copy(out[:, c0:c0 + c], t[:, :c])
        return out

    return chunked_copy


class CountingDriver:
    """The simulator driver, counting the estimates the tuner asks for."""

    def __init__(self, profile="trn2"):
        self.inner = get_driver("sim", get_profile(profile))
        self.profile = self.inner.profile
        self.estimates = 0

    def load(self, device, program):
        return self.inner.load(device, program)

    def estimate(self, device, loaded):
        self.estimates += 1
        return self.inner.estimate(device, loaded)


SPEC = TensorSpec((128, 2048), F32)


def times(kernel, *args, **kwargs):
    drv = get_driver("sim", get_profile("trn2"))
    return [drv.estimate(0, drv.load(0, kernel.trace(*args, **c, **kwargs))).device_ns
            for c in configurations(kernel)]


def test_search_is_exhaustive_and_picks_the_minimum():
    k = make_copy_kernel()
    configs = configurations(k)
    assert configs[:3] == [{"chunk": 64, "bufs": 2}, {"chunk": 64, "bufs": 4}, {"chunk": 512, "bufs": 2}]
    ns = times(k, SPEC)
    drv = CountingDriver()
    best = tune(k, SPEC, driver=drv, progress=False)
    assert drv.estimates == len(configs) == 8
    assert best == configs[int(np.argmin(ns))]  # argmin: the first of equal times wins
    entry = json.loads(autotune.entry_path(k.signature_key(k.signature.bind(SPEC), drv.profile)).read_text())
    assert entry["device_ns"] == min(ns) and [t["config"] for t in entry["trials"]] == configs
    assert entry["kernel"] == "chunked_copy" and entry["version"] == 1 and entry["profile"] == "trn2"
    assert entry["signature"] == "x: float32[128, 2048]"


def test_search_is_deterministic_and_ties_go_to_the_first():
    @nk.kernel(tunables={"unused": (3, 1, 2)})
    def same(x, unused=3):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.hbm)
        nisa.dma_copy(out, x)
        return out

    runs = [tune(same, SPEC, force=True, progress=False) for _ in range(2)]
    assert runs == [{"unused": 3}, {"unused": 3}]
    k = make_copy_kernel()
    first = tune(k, SPEC, force=True, progress=False)
    trials = json.loads(next(autotune.cache_dir().glob("chunked*")).read_text())["trials"]
    assert tune(k, SPEC, force=True, progress=False) == first
    assert json.loads(next(autotune.cache_dir().glob("chunked*")).read_text())["trials"] == trials


def test_failing_configurations_are_skipped_and_listed():
    k = make_copy_kernel(choices=(64, 10**6, 256))  # a [128, 1e6] fp32 tile cannot exist: KernelError
    best = tune(k, SPEC, progress=False)
    assert best["chunk"] in (64, 256)
    trials = json.loads(next(autotune.cache_dir().glob("chunked*")).read_text())["trials"]
    failed = [t for t in trials if "error" in t]
    assert [t["config"]["chunk"] for t in failed] == [10**6, 10**6]
    assert all("needs 4000000 bytes per partition" in t["error"] for t in failed)
    assert all("device_ns" in t for t in trials if t["config"]["chunk"] != 10**6)


def test_all_configurations_failing_is_an_error():
    k = make_copy_kernel(choices=(10**6, 10**7))
    with pytest.raises(KernelError, match="every one of 4 configurations failed to trace"):
        tune(k, SPEC, progress=False)


def test_tunables_are_not_arguments_of_tune():
    with pytest.raises(KernelError, match=r"\['chunk'\] are tunables"):
        tune(make_copy_kernel(), SPEC, chunk=64)


def test_a_cached_result_is_returned_without_search_and_used_by_calls():
    k = make_copy_kernel()
    first = CountingDriver()
    best = tune(k, SPEC, driver=first, progress=False)
    again = CountingDriver()
    assert tune(k, SPEC, driver=again) == best and again.estimates == 0
    forced = CountingDriver()
    assert tune(k, SPEC, driver=forced, force=True, progress=False) == best and forced.estimates == 8
    # the JIT fills in the tuned choice when a call does not pass the tunables
    assert k.trace(SPEC) is k.trace(SPEC, **best)
    x = np.arange(128 * 2048, dtype=np.float32).reshape(128, 2048)
    np.testing.assert_array_equal(k(x), x)


def test_entries_are_keyed_by_version_profile_and_signature(cache):
    k1 = make_copy_kernel(version=1)
    tune(k1, SPEC, progress=False)
    tune(k1, TensorSpec((128, 1000), F32), progress=False)
    tune(k1, TensorSpec((128, 2048), DType.bfloat16), progress=False)
    tune(k1, SPEC, profile="trn3", progress=False)
    names = sorted(p.name for p in cache.glob("*.json"))
    assert len(names) == 4 and sum("-trn3-" in n for n in names) == 1
    assert all(n.startswith("chunked_copy-v1-") for n in names)
    k2 = make_copy_kernel(version=2)  # a new version retunes: the old choices do not apply
    key2 = k2.signature_key(k2.signature.bind(SPEC), get_profile("trn2"))
    assert best_config(k2, key2, get_profile("trn2")) is None
    drv = CountingDriver()
    tune(k2, SPEC, driver=drv, progress=False)
    assert drv.estimates == 8 and len(list(cache.glob("chunked_copy-v2-*.json"))) == 1


def test_a_recalibrated_profile_retunes():
    """The profile's figures are part of the key: a choice timed with other figures (a recalibration) does not
    apply, the same figures find it again."""
    k = make_copy_kernel()
    trn2 = get_profile("trn2")
    key = k.signature_key(k.signature.bind(SPEC), trn2)
    record(key, {"chunk": 256, "bufs": 4}, 1.0, [])
    assert best_config(k, k.signature_key(k.signature.bind(SPEC), trn2.replace()), trn2) == {"chunk": 256, "bufs": 4}
    other = trn2.replace(dma_fixed_ns=trn2.dma_fixed_ns + 1)
    assert best_config(k, k.signature_key(k.signature.bind(SPEC), other), other) is None


def test_a_stale_entry_with_unknown_tunables_is_reported():
    k = make_copy_kernel()
    key = k.signature_key(k.signature.bind(SPEC), get_profile("trn2"))
    record(key, {"tile": 3}, 1.0, [])
    with pytest.raises(RuntimeError, match=r"names tunables \['tile'\]"):
        k.trace(SPEC)


def test_progress_bar_on_stderr(capsys):
    tune(make_copy_kernel(), SPEC)
    err = capsys.readouterr().err
    assert "tune chunked_copy" in err and "8/8 configs" in err and "best" in err and " us (chunk=" in err


# -- concurrency -------------------------------------------------------------------------------------
def _writer(cache_dir: str, worker: int, rounds: int) -> None:
    import os

    os.environ["NEURON_KERNELS_TUNE_CACHE"] = cache_dir
    shared = ("shared", 1, "trn2", (("x", TensorSpec((4, 4), F32)),))
    own = ("own", 1, "trn2", (("x", TensorSpec((worker + 1, 4), F32)),))
    trials = [{"config": {"chunk": c}, "device_ns": float(c)} for c in range(200)]  # a sizeable file
    for i in range(rounds):
        record(shared, {"chunk": worker * 1000 + i}, float(i), trials)
        record(own, {"chunk": i}, float(i), trials)


def _reader(cache_dir: str, rounds: int, errors) -> None:
    import os

    os.environ["NEURON_KERNELS_TUNE_CACHE"] = cache_dir
    key = ("shared", 1, "trn2", (("x", TensorSpec((4, 4), F32)),))

    class K:
        name, version, tunables = "shared", 1, {"chunk": ()}

    for _ in range(rounds):
        try:
            best_config(K, key, None)
        except Exception as e:  # a torn or half-written entry would land here
            errors.append(repr(e))


def test_concurrent_writers_never_corrupt_the_cache(cache):
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager:
        errors = manager.list()
        procs = [ctx.Process(target=_writer, args=(str(cache), w, 60)) for w in range(4)]
        procs.append(ctx.Process(target=_reader, args=(str(cache), 400, errors)))
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        assert list(errors) == []
    files = sorted(cache.iterdir())
    assert len(files) == 5 and all(f.suffix == ".json" for f in files)  # no temporary files left behind
    for f in files:
        entry = json.loads(f.read_text())
        assert entry["config"]["chunk"] % 1000 == 59  # every writer's last record is complete


def test_concurrent_tuners_agree(cache):
    # Separate interpreters through the CLI: nothing from this test module has to be importable there.
    cmd = [sys.executable, "-c", "import sys; from neuron_kernels.tune_cli import main; sys.exit(main(sys.argv[1:]))",
           "run", "neuron_kernels.library.movement:transpose", "--arg", "x=256x384:bfloat16", "--force",
           "--no-progress"]
    env = {**os.environ, "NEURON_KERNELS_TUNE_CACHE": str(cache)}
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    [entry] = cache.glob("transpose-*.json")
    config = json.loads(entry.read_text())["config"]
    assert all(f": tile_bytes={config['tile_bytes']}:" in out for out, _ in outs), outs


# -- neuron-tune -------------------------------------------------------------------------------------
def test_cli_run_list_show_clear(cache, capsys):
    target = "neuron_kernels.library.movement:transpose"
    assert tune_cli.main(["run", target, "--arg", "x=256x384:bfloat16", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "transpose v1 trn2 (x: bfloat16[256, 384], dim0=-2, dim1=-1): tile_bytes=" in out
    assert tune_cli.main(["run", "neuron_kernels.library.movement:permute", "--arg", "x=[8,16,32]:float32",
                          "--const", "dims=(2, 0, 1)", "--profile", "trn3", "--no-progress"]) == 0
    capsys.readouterr()
    assert tune_cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "KERNEL" in out and "x: bfloat16[256, 384]" in out and "dims=(2, 0, 1)" in out and "trn3" in out
    assert tune_cli.main(["show", "transpose"]) == 0
    out = capsys.readouterr().out
    assert "kernel     transpose v1 on trn2" in out and "trials     4" in out and "tile_bytes=4096" in out
    [path] = cache.glob("permute-*.json")
    assert tune_cli.main(["show", str(path)]) == 0
    assert "signature  x: float32[8, 16, 32], dims=(2, 0, 1)" in capsys.readouterr().out
    assert tune_cli.main(["clear", "permute"]) == 0
    assert "removed 1 tuning cache entry matching 'permute'" in capsys.readouterr().out
    assert tune_cli.main(["list", "permute"]) == 0
    assert "no tuning cache entries" in capsys.readouterr().out
    assert tune_cli.main(["clear"]) == 0
    assert "removed 1 tuning cache entry" in capsys.readouterr().out
    assert not list(cache.glob("*.json"))


def test_cli_errors(capsys):
    assert tune_cli.main(["show", "nothing-like-this"]) == 1
    assert tune_cli.main(["run", "neuron_kernels.library.movement:copy", "--arg", "x=4x4:float32"]) == 1
    assert "declares no tunables" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tune_cli.main(["run", "neuron_kernels.library.movement:transpose", "--arg", "x=4x4"])  # no dtype
    with pytest.raises(SystemExit, match="not a kernel"):
        tune_cli.main(["run", "neuron_kernels.library.movement:cat", "--arg", "x=4x4:float32"])
