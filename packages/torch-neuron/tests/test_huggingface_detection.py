"""The Hugging Face libraries pick the neuron device on their own: no ``ACCELERATE_TORCH_DEVICE``, no code change
(Transformers and Accelerate detect it through the ``torch_neuronx`` import name that ``torch_neuronx_compat``
answers; Diffusers through ``torch.accelerator``). Each run is compared with the same run on the CPU, and AWS's
package, when importable, is never shadowed."""

import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch
from test_huggingface import BF16, FP32, sft_run, tiny_llama, tiny_unet, trainer_task, word_tokenizer
from torch_neuron_testing.native import native

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@contextlib.contextmanager
def detected(dev="neuron"):
    """Accelerate's process state made afresh with no device variable set: ``dev`` is what the libraries find."""
    from accelerate.state import AcceleratorState, GradientState

    def reset():
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

    old = os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
    reset()
    try:
        with native() if dev == "neuron" else contextlib.nullcontext():
            yield
    finally:
        reset()
        if old is not None:
            os.environ["ACCELERATE_TORCH_DEVICE"] = old


def test_transformers_and_accelerate_detect_neuron():
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    from accelerate.utils import is_neuron_available
    from transformers.utils import import_utils

    assert is_neuron_available() and is_neuron_available(check_device=True)
    assert import_utils.is_torch_neuron_available() and import_utils.is_torch_bf16_gpu_available()
    assert not import_utils.is_torch_neuroncore_available()  # that is AWS's XLA path, which this device is not


def test_compat_module_exposes_nothing_of_aws_api():
    import torch_neuronx

    assert torch_neuronx.__torch_neuron_compat__
    assert not hasattr(torch_neuronx, "trace")
    with pytest.raises(AttributeError, match="torch-neuron's compatibility module"):
        _ = torch_neuronx.trace
    with pytest.raises(ModuleNotFoundError, match="torch-neuron's compatibility module"):
        import torch_neuronx.xla_impl  # noqa: F401


def run_python(code, *, path=(), env=None):
    environ = {**os.environ, **(env or {})}
    environ.pop("ACCELERATE_TORCH_DEVICE", None)
    environ["PYTHONPATH"] = os.pathsep.join([*path, environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True,
                          text=True, check=True).stdout.split()


def test_aws_torch_neuronx_is_never_shadowed(tmp_path):
    """A ``torch_neuronx`` anywhere on ``sys.path`` (here a module standing for AWS's) is what is imported, even
    after torch-neuron loaded; the compatibility module answers only when nothing else does."""
    (tmp_path / "torch_neuronx.py").write_text("MARK = 'aws'\n")
    code = """
        import torch, torch_neuron, importlib.util, torch_neuronx
        print(getattr(torch_neuronx, 'MARK', 'compat'), importlib.util.find_spec('torch_neuronx').origin)
    """
    got, origin = run_python(code, path=[str(tmp_path)])
    assert got == "aws" and origin == str(tmp_path / "torch_neuronx.py")
    assert run_python(code)[0] == "compat"
    assert run_python("import torch, importlib.util; print(importlib.util.find_spec('torch_neuronx'))",
                      env={"TORCH_NEURON_TORCH_NEURONX": "0"}) == ["None"]


def test_accelerator_picks_neuron_and_bf16_without_env():
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    from accelerate import Accelerator

    with detected():
        acc = Accelerator(mixed_precision="bf16")
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
        computed = []  # the prepared model's forward casts its output back to float32: look inside
        model[0].register_forward_hook(lambda mod, args, out: computed.append(out.dtype))
        model = acc.prepare(model)
        out = model(torch.randn(2, 8, device=acc.device))
        assert acc.device.type == "neuron" and acc.mixed_precision == "bf16"
    assert model[0].weight.device.type == "neuron" and out.device.type == "neuron" and computed == [torch.bfloat16]


def trainer_losses(bf16, lora=False, **kw):
    from transformers import Trainer, TrainingArguments

    model, data = trainer_task("llama")
    if lora:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, max_steps=4, per_device_train_batch_size=4, learning_rate=5e-3,
                                 logging_steps=1, report_to=[], save_strategy="no", seed=0, disable_tqdm=True,
                                 bf16=bf16, use_cpu=kw.pop("use_cpu", False), **kw)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
        if kw.get("torch_compile"):
            assert args.torch_compile_backend == "neuron"  # Transformers' own default once it detects neuron
    return next(trainer.model.parameters()).device, [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_trainer_bf16_picks_neuron_without_env():
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    with detected("cpu"):
        _, want = trainer_losses(True, use_cpu=True)
    with detected():
        device, got = trainer_losses(True)
    assert device.type == "neuron" and len(got) == 4
    torch.testing.assert_close(got, want, **BF16)


def test_peft_lora_trainer_bf16_picks_neuron_without_env():
    pytest.importorskip("peft", reason="peft is not installed")
    with detected("cpu"):
        _, want = trainer_losses(True, lora=True, use_cpu=True)
    with detected():
        device, got = trainer_losses(True, lora=True)
    assert device.type == "neuron" and len(got) == 4
    torch.testing.assert_close(got, want, **BF16)


def test_trainer_fp16_is_refused_by_accelerate_for_neuron():
    """Accelerate enables fp16 (with a GradScaler) only on its own list of devices, which has no ``neuron`` (nor
    does AWS's): the refusal is Accelerate's, named clearly; bf16 is neuron's mixed precision."""
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    with detected(), pytest.raises(ValueError, match="fp16 mixed precision requires a device in .*not 'neuron'"):
        trainer_losses(False, fp16=True)


def test_trainer_bf16_torch_compile_defaults_to_neuron_backend():
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    torch._dynamo.reset()
    with detected("cpu"):
        _, want = trainer_losses(True, use_cpu=True)
    torch.neuron.reset_metrics()
    with detected():
        device, got = trainer_losses(True, torch_compile=True)
    assert device.type == "neuron" and torch.neuron.metrics()["compile"].get("forward_graphs", 0) > 0
    torch.testing.assert_close(got, want, **BF16)


def test_trl_sft_trainer_default_bf16_picks_neuron():
    pytest.importorskip("trl", reason="trl is not installed")
    pytest.importorskip("datasets", reason="datasets is not installed")
    with detected("cpu"):
        _, want = sft_run("cpu", bf16=True)
    with detected():
        device, got = sft_run("neuron", bf16=True)
    assert device.type == "neuron" and len(got) == 5
    torch.testing.assert_close(got, want, **BF16)


def test_diffusers_pipeline_to_detected_device():
    pytest.importorskip("diffusers", reason="diffusers is not installed")
    from diffusers import DDPMPipeline, DDPMScheduler
    from diffusers.utils.torch_utils import get_device

    dev = get_device()
    assert dev == "neuron"
    pipe = DDPMPipeline(unet=tiny_unet(), scheduler=DDPMScheduler(num_train_timesteps=20))
    images = {}
    for d in ("cpu", dev):
        pipe.to(d).set_progress_bar_config(disable=True)
        images[d] = pipe(generator=torch.Generator("cpu").manual_seed(0), num_inference_steps=4, batch_size=2,
                         output_type="pt").images.cpu()
    assert pipe.device.type == "neuron"
    torch.testing.assert_close(images[dev], images["cpu"], **FP32)


def test_transformers_pipeline_device_index_means_neuron():
    from transformers import pipeline

    tok = word_tokenizer()
    model = tiny_llama(len(tok), pad_token_id=0, bos_token_id=1, eos_token_id=2).eval()
    ids = tok("the cat sat", return_tensors="pt").input_ids
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False)
    pipe = pipeline("text-generation", model=model, tokenizer=tok, device=0)
    assert pipe.device == torch.device("neuron", 0) and model.device == torch.device("neuron", 0)
    with native("mm"):
        out = pipe("the cat sat", max_new_tokens=4, do_sample=False, return_tensors=True)
    assert out[0]["generated_token_ids"] == want[0].tolist()
    assert pipeline("text-generation", model=model.cpu(), tokenizer=tok, device=-1).device.type == "cpu"


LAUNCHED = """
import torch
from accelerate import Accelerator

acc = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
computed = []
model[0].register_forward_hook(lambda mod, args, out: computed.append(out.dtype))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
x, y = torch.randn(32, 8, device=acc.device), torch.randn(32, 1, device=acc.device)
losses = []
for _ in range(5):
    loss = torch.nn.functional.mse_loss(model(x), y)
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
graphs = torch.neuron.metrics()["compile"].get("forward_graphs", 0)
print(acc.state.dynamo_plugin.backend.value, acc.device.type, acc.mixed_precision, computed[0], losses[-1] < losses[0],
      graphs > 0)
"""


def launch(tmp_path, *args) -> list[str]:
    """``accelerate launch ARGS train.py`` (one process, none of the machine's config or device variables): the
    training script's last line, split."""
    script = tmp_path / "train.py"
    script.write_text(LAUNCHED)
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_TORCH_DEVICE"}
    env["HF_HOME"] = str(tmp_path)  # no accelerate config file of the machine's
    out = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
                          "--num_machines", "1", *args, str(script)], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()[-6:]


def test_accelerate_launch_bf16_dynamo(tmp_path):
    """``accelerate launch --mixed_precision bf16 --dynamo_backend inductor script.py`` (one process): the script's
    ``Accelerator()`` finds neuron and bf16 autocast, its model is compiled (Inductor's graphs on neuron go to the
    neuron backend: ``inductor_route``; the launcher's ``--dynamo_backend`` list has no ``neuron``), and it trains."""
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    got = launch(tmp_path, "--mixed_precision", "bf16", "--dynamo_backend", "inductor")
    assert got == ["INDUCTOR", "neuron", "bf16", "torch.bfloat16", "True", "True"]


def test_accelerate_launch_config_file_dynamo_backend_neuron(tmp_path):
    """An Accelerate config file (what ``accelerate config`` writes) with ``dynamo_backend: NEURON``, Accelerate's
    own name for the Neuron backend: the launcher's command-line list lacks it, the config file does not; the script
    compiles with ``torch.compile(backend="neuron")`` and trains in bf16 on neuron."""
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    config = tmp_path / "accelerate.yaml"
    config.write_text(textwrap.dedent("""\
        compute_environment: LOCAL_MACHINE
        distributed_type: 'NO'
        mixed_precision: bf16
        num_machines: 1
        num_processes: 1
        dynamo_config:
          dynamo_backend: NEURON
        """))
    got = launch(tmp_path, "--config_file", str(config))
    assert got == ["NEURON", "neuron", "bf16", "torch.bfloat16", "True", "True"]
