"""The neuron device as torch sees it: registration, torch.neuron, torch.accelerator, streams, events, RNG."""

import os
import subprocess
import sys

import pytest
import torch


def test_import_torch_registers_neuron():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.neuron.is_available()
    assert torch.accelerator.current_accelerator().type == "neuron"
    assert torch.accelerator.device_count() == torch.neuron.device_count()


def test_init_and_is_initialized():
    torch.neuron.init()  # idempotent, as torch.cuda.init()
    assert torch.neuron.is_initialized()


def test_device_poison_fork():
    """As CUDA's: a child forked after the runtime came up cannot initialize it (it holds a copy of the parent's);
    a fresh process (the 'spawn' start method) can, and the parent is unaffected."""
    import multiprocessing

    def child(queue):
        try:
            torch.neuron.init()
            queue.put(("ok", "", torch.neuron._is_in_bad_fork(), torch.neuron.is_initialized()))
        except RuntimeError as e:
            queue.put(("raised", str(e), torch.neuron._is_in_bad_fork(), torch.neuron.is_initialized()))

    torch.neuron.init()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=child, args=(queue,))
    p.start()
    p.join()
    status, message, bad, initialized = queue.get(timeout=60)
    assert (status, bad, initialized) == ("raised", True, False)
    assert "Cannot re-initialize Neuron in forked subprocess" in message and "'spawn'" in message
    code = "import torch; torch.neuron.init(); print(torch.neuron.is_initialized(), torch.neuron._is_in_bad_fork())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]
    assert torch.neuron.is_initialized() and not torch.neuron._is_in_bad_fork()


def test_device_count_is_the_profiles_cores():
    assert torch.neuron.device_count() == torch.neuron.runtime().profile.cores_per_chip


def test_autoload_can_be_turned_off():
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    code = "import torch; print(torch._C._get_privateuse1_backend_name())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "privateuseone"


def test_a_failing_backend_leaves_import_torch_working():
    """A failure while loading the backend (here a bad size variable) warns, naming the cause, and leaves torch
    usable without the device; importing torch_neuron itself raises the error."""
    env = dict(os.environ, NEURON_SIM_HBM_BYTES="64Q")
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import torch\n"
            "print(float(torch.ones(3).sum()), hasattr(torch, 'neuron'))\n"
            "import torch_neuron\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "3.0 False", out.stderr[-2000:]
    assert "neuron device is unavailable" in out.stderr and "NEURON_SIM_HBM_BYTES='64Q'" in out.stderr
    assert out.returncode != 0 and "ValueError: NEURON_SIM_HBM_BYTES='64Q' is not a positive byte size" in out.stderr


def test_importing_torch_neuron_before_torch_works():
    code = "import torch_neuron, torch; print((torch.ones(2, device='neuron') + 1).cpu().tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[2.0, 2.0]"


def test_current_device_and_context():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        assert torch.empty(2, device="neuron").device == torch.device("neuron", 1)
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device("neuron:2")
    try:
        assert torch.accelerator.current_device_index() == 2
    finally:
        torch.neuron.set_device(0)


def test_invalid_device_index():
    """An index past the last device is a RuntimeError naming the index and the range, as CUDA's invalid device
    ordinal, from every way in: torch.accelerator, a tensor factory, torch.neuron."""
    n = torch.neuron.device_count()
    limit = (f"The device index is out of range: neuron:{n} does not exist, this machine has {n} neuron devices "
             f"\\(valid indices 0..{n - 1}\\)")
    with pytest.raises(RuntimeError, match=limit):
        torch.accelerator.set_device_index(n)
    with pytest.raises(RuntimeError, match=limit):
        torch.empty(1, device=f"neuron:{n}")
    with pytest.raises(RuntimeError, match=limit):
        torch.neuron.set_device(n)
    assert torch.neuron.current_device() == 0 and torch.ones(1, device="neuron").item() == 1


def test_device_properties_come_from_the_profile():
    props = torch.neuron.get_device_properties(0)
    profile = torch.neuron.runtime().profile
    assert props.profile == profile.name
    assert props.total_memory == torch.neuron.runtime().infos[0].hbm_bytes
    assert props.tensor_tflops_bf16 == pytest.approx(profile.tensor_peak_flops / 1e12)
    assert "NeuronCore" in torch.neuron.get_device_name()


def test_tensor_roundtrip_keeps_values_and_dtype():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int8,
                  torch.uint8, torch.bool, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2):
        x = (torch.arange(24) % 7 - 3).reshape(2, 3, 4).to(dtype)
        y = x.to("neuron")
        assert y.device.type == "neuron" and y.dtype == dtype
        torch.testing.assert_close(y.cpu(), x, rtol=0, atol=0)


def test_data_ptr_is_the_device_address():
    x = torch.arange(10.0, device="neuron")
    assert x[3:].data_ptr() == x.data_ptr() + 3 * 4
    rt = torch.neuron.runtime()
    assert rt.allocator.device_of(x.data_ptr()) == 0


def test_views_share_storage_and_read_strided():
    x = torch.arange(24.0).reshape(4, 6)
    y = x.to("neuron")
    for view in (lambda t: t.t(), lambda t: t[1:, ::2], lambda t: t.reshape(6, 4)[2], lambda t: t.expand(2, 4, 6),
                 lambda t: t.unfold(1, 3, 2), lambda t: t.as_strided((3, 3), (1, 5), 2)):
        torch.testing.assert_close(view(y).cpu(), view(x))
    assert y.t().untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def test_strided_device_copies_and_casts():
    x = torch.randn(5, 7)
    y = x.to("neuron")
    torch.testing.assert_close(y.t().contiguous().cpu(), x.t().contiguous())
    torch.testing.assert_close(y.to(torch.bfloat16).cpu(), x.to(torch.bfloat16))
    torch.testing.assert_close(y.to(torch.int32).cpu(), x.to(torch.int32))
    dst = torch.zeros(7, 10, device="neuron")
    dst[:, ::2].copy_(y.t())
    expect = torch.zeros(7, 10)
    expect[:, ::2] = x.t()
    torch.testing.assert_close(dst.cpu(), expect)


def test_copy_between_overlapping_views():
    x = torch.arange(10.0)
    y = x.to("neuron")
    y[1:].copy_(y[:-1].clone())
    x[1:] = x[:-1].clone()
    torch.testing.assert_close(y.cpu(), x)
    y = torch.arange(10.0).to("neuron")
    with pytest.raises(RuntimeError, match="refer to a single memory location"):  # as on the CPU (test_copy.py)
        y[2:].copy_(y[:-2])


@pytest.mark.parametrize("write", [lambda t: t.copy_(torch.ones(t.shape, device="neuron")), lambda t: t.add_(1),
                                   lambda t: t.copy_(torch.ones(t.shape)),  # from the host
                                   lambda t: t.neg_(), lambda t: torch.mul(t, 2, out=t)])
def test_writes_into_self_overlapping_views_raise(write):
    """A written view whose elements share memory ([3, 2] over 4 elements, strides (1, 1)): the CPU writes an
    order-dependent result PyTorch calls undefined; the device raises torch's internal-overlap error, as both
    do for a zero stride, and the tensor stays usable."""
    y = torch.arange(4.0, device="neuron")
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        write(y.as_strided((3, 2), (1, 1)))
    torch.testing.assert_close(y.cpu(), torch.arange(4.0))


def test_cpu_fallback_in_place_on_an_expanded_tensor_raises():
    """uint32 arithmetic runs on the CPU from a dense copy; writing its result back into the expanded target
    raises torch's internal-overlap error as the CPU does (it was a KernelError from the device copy)."""
    for device in ("cpu", "neuron"):
        x = torch.zeros(2, 1, dtype=torch.uint32, device=device).expand(2, 2)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            x.mul_(3)


def test_writes_into_interleaved_views():
    """Strides that interleave without sharing an element ([3, 2] with strides (2, 3) is 0 2 4 3 5 7): copies and
    in-place ops write them as on the CPU."""
    results = []
    for device in ("cpu", "neuron"):
        b = torch.zeros(12, device=device)
        x = b.as_strided((3, 2), (2, 3))
        x.copy_(torch.arange(6.0).view(3, 2))
        x.mul_(torch.full((3, 2), 2.0, device=device)).add_(1)
        results.append(b.cpu())
    torch.testing.assert_close(results[1], results[0])


def test_copy_between_devices():
    x = torch.randn(3, 4)
    a = x.to("neuron:0")
    b = a.to("neuron:1")
    assert b.device == torch.device("neuron", 1)
    torch.testing.assert_close(b.cpu(), x)


def test_item_and_zero_dim():
    x = torch.tensor(2.5).to("neuron")
    assert x.dim() == 0 and x.item() == 2.5
    assert torch.tensor(True).to("neuron").item() is True


def test_zero_size_tensors():
    x = torch.empty(0, 3, device="neuron")
    assert x.cpu().shape == (0, 3)
    assert torch.empty(3, 0).to("neuron").shape == (3, 0)


def test_resize_keeps_values():
    x = torch.arange(4.0).to("neuron")
    x.resize_(8)
    torch.testing.assert_close(x[:4].cpu(), torch.arange(4.0))
    storage = x.untyped_storage()
    storage.resize_(64)
    assert storage.nbytes() == 64
    torch.testing.assert_close(x[:4].cpu(), torch.arange(4.0))


def test_set_to_another_tensors_storage():
    x = torch.arange(6.0).to("neuron")
    y = torch.empty(0, device="neuron")
    y.set_(x.untyped_storage(), 2, (2, 2), (2, 1))
    torch.testing.assert_close(y.cpu(), torch.tensor([[2.0, 3.0], [4.0, 5.0]]))


def test_streams_are_hal_queues_and_events_time_device_work():
    assert torch.neuron.current_stream().stream_id == 0
    s = torch.neuron.Stream()
    assert s.stream_id != 0
    x = torch.randn(256, 512).to("neuron")
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with s:
        assert torch.neuron.current_stream() == s
        start.record()
        x.t().contiguous()
        end.record()
    assert torch.neuron.current_stream().stream_id == 0
    ms = start.elapsed_time(end)
    assert 0 < ms < 1  # a 512 KiB transpose takes microseconds of device time
    torch.neuron.synchronize()
    s.synchronize()


def test_stream_without_an_index_is_on_the_current_device():
    """torch.Stream(device="neuron") takes the current device, as for CUDA (the index stayed -1 and every use of
    the stream raised); work on it runs and its events time it."""
    s = torch.Stream(device="neuron")
    assert s.device_index == torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.Stream(device="neuron").device_index == 1
        assert torch.accelerator.current_stream(torch.device("neuron")).device_index == 1
    x = torch.ones(3, device="neuron")
    start, end = torch.Event(device="neuron", enable_timing=True), torch.Event(device="neuron", enable_timing=True)
    with s:
        start.record(s)
        y = x + 1
        end.record(s)
    s.synchronize()
    assert y.cpu().tolist() == [2.0, 2.0, 2.0] and start.elapsed_time(end) > 0


def test_pin_memory():
    """Tensor.pin_memory() gives page-aligned host memory registered as pinned (is_pinned() for any address in
    it, views included); transfers from it, non_blocking too, carry the values."""
    t = torch.arange(1000.0)
    assert not t.is_pinned()
    p = t.pin_memory()
    assert p.is_pinned() and p[10:].is_pinned() and p.data_ptr() % 4096 == 0 and torch.equal(p, t)
    d = p.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(d.cpu(), t)
    back = torch.empty(1000).pin_memory()
    back.copy_(d, non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(back, t)


def test_dataloader_pin_memory():
    data = torch.utils.data.TensorDataset(torch.arange(8.0).view(4, 2))
    (batch,) = next(iter(torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)))
    assert batch.is_pinned() and torch.equal(batch.to("neuron").cpu(), torch.arange(8.0).view(4, 2))


def test_generators_and_rng_state():
    torch.neuron.manual_seed(123)
    g = torch.neuron.default_generator()
    assert g.device.type == "neuron" and g.initial_seed() == 123
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    first = torch.neuron.random.reserve(None, 10, 0)
    assert first == (123, 0)
    assert torch.neuron.random.reserve(None, 5, 0) == (123, 10)
    torch.neuron.set_rng_state(state)
    assert torch.neuron.random.reserve(None, 1, 0) == (123, 0)
    mine = torch.Generator("neuron").manual_seed(7)
    assert torch.neuron.random.reserve(mine, 4, 0) == (7, 0)
    torch.manual_seed(5)  # torch.manual_seed seeds every accelerator's default generators too
    assert torch.neuron.initial_seed() == 5


def test_host_alias_shares_device_memory_on_the_simulator():
    x = torch.arange(12.0).reshape(3, 4).to("neuron")
    alias = torch.neuron.host_alias(x.t())
    assert alias.device.type == "cpu" and alias.shape == (4, 3)
    torch.testing.assert_close(alias, torch.arange(12.0).reshape(3, 4).t())
    alias[0, 1] = -1.0  # element (1, 0) of x
    assert x[1, 0].item() == -1.0


def test_copies_of_contiguous_tensors_with_odd_strides_on_size_one_dims():
    x = (torch.zeros(1, 3).t()[0] + 3, torch.ones(1, 3).t()[:1])  # contiguous, last stride != 1
    for t in x:
        assert t.is_contiguous()
        d = t.to("neuron")
        torch.testing.assert_close(d.cpu(), t)
        back = torch.empty_like(t).copy_(d)
        torch.testing.assert_close(back, t)
