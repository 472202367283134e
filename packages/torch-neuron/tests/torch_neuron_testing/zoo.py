"""One architecture of transformers' causal-LM mapping on ``neuron`` against the CPU: forward logits, backward
gradients (of a cross-entropy on the logits) and greedy ``generate()``, from one tiny random model whose weights
are copied to the device (see :mod:`.zoo_config` for how the model is made tiny).

Each stage gets a status: ``pass``, ``fail`` (with the exception or the largest error), or the whole architecture
is ``n/a`` when it cannot be built here (an external package or remote code it needs; the reason names it).
CPU fallbacks are correct by construction but are listed: a pass that needed them says which ops.
"""

from __future__ import annotations

import copy
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from .zoo_config import special_token_ids, tiny_config

DEV = "neuron"
TOL = dict(rtol=1e-4, atol=1e-5)  # float32, as the compile tests compare
MAX_PARAMS = 2_000_000
BATCH, PROMPT, NEW_TOKENS = 2, 12, 4
STAGES = ("forward", "backward", "generate")


class StageResult:
    """What the zoos' result dataclasses share: one status field per stage of ``stages``."""

    stages: ClassVar[tuple[str, ...]]

    @property
    def passed(self) -> bool:
        return all(getattr(self, s) == "pass" for s in self.stages)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ZooResult(StageResult):
    stages: ClassVar[tuple[str, ...]] = STAGES
    arch: str
    forward: str = "not run"
    backward: str = "not run"
    generate: str = "not run"
    fallback: list[str] = field(default_factory=list)
    reason: str = ""
    params: int = 0
    seconds: float = 0.0


class CpuReferenceError(Exception):
    """The CPU run itself failed: the tiny config (not the backend) is at fault."""


def on_cpu(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - re-raised with the stage's context
        raise CpuReferenceError(f"the CPU reference fails too ({_first_line(e)} at {_where(e)}): config problem") from e


class NotApplicable(Exception):
    """The architecture cannot be built here for a reason outside the backend (named in the message)."""


def model_class_name(arch: str) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[arch]


# Architectures whose causal-LM class has no standalone forward, with the reason.
NOT_APPLICABLE = {
    "gemma4_assistant": "a draft model for assisted generation: its forward requires the target model's "
                        "inputs_embeds and shared_kv_states (no standalone forward or generate)",
    "gemma4_unified_assistant": "a draft model for assisted generation: its forward requires the target model's "
                                "inputs_embeds and shared_kv_states (no standalone forward or generate)",
}


def _model_config(arch: str, config):
    """The config the causal-LM class takes: a composite config's sub-config when the class is the decoder's
    (as the Auto class does for text_config; musicgen's decoder is under ``decoder``)."""
    import transformers

    cls = getattr(transformers, model_class_name(arch))
    want = getattr(cls, "config_class", None)
    if want is None or isinstance(config, want):
        return config
    for key in getattr(config, "sub_configs", {}) or {}:
        if isinstance(getattr(config, key, None), want):
            return getattr(config, key)
    return config


def build(arch: str):
    """The tiny CPU model of ``arch`` (eval mode: dropout off), built from its config by the mapping's class."""
    import transformers

    if arch in NOT_APPLICABLE:
        raise NotApplicable(NOT_APPLICABLE[arch])
    config = _model_config(arch, tiny_config(arch))
    torch.manual_seed(0)
    try:
        model = getattr(transformers, model_class_name(arch))._from_config(config)
    except ImportError as e:  # a package the architecture needs (timm, ...) is not installed
        raise NotApplicable(f"needs an external package: {_first_line(e)}") from e
    _randomize_constant_matrices(model)
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        raise ValueError(f"the tiny config still has {n:,} parameters (> {MAX_PARAMS:,}): zoo_config misses a size")
    return model.eval(), n


def _randomize_constant_matrices(model) -> None:
    """Weight matrices a model initializes to one constant (zeroed MoE routers) get small random values: with a
    zero router every routing score ties, torch.topk leaves the order of ties unspecified (the CPU's comes from
    std::nth_element), and the comparison would test that tie-break instead of the model."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * 0.02)


def prompt(model) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random prompt that avoids the config's special tokens (an image token would want an image); one
    row per codebook of each sequence for multi-codebook decoders (musicgen: [batch * codebooks, length])."""
    text = model.config.get_text_config()
    head = model.get_output_embeddings()
    vocab = text.vocab_size
    if isinstance(head, torch.nn.Linear):
        vocab = min(vocab, head.out_features)
    allowed = torch.tensor([i for i in range(vocab) if i not in special_token_ids(model.config)])
    rows = BATCH * (getattr(text, "num_codebooks", None) or 1)
    g = torch.Generator().manual_seed(1)
    ids = allowed[torch.randint(0, len(allowed), (rows, PROMPT), generator=g)]
    return ids, torch.ones_like(ids)


def _first_line(e: BaseException) -> str:
    text = " ".join(line.strip() for line in str(e).strip().splitlines()[:2])  # validation errors: the cause
    return f"{type(e).__name__}: {text[:240]}"


def _where(e: BaseException) -> str:
    """The innermost frame, and the innermost in the backend's own code when that is a different one."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return "?"
    here = [f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}"]
    backend = [f for f in frames if f"{os.sep}torch_neuron{os.sep}" in f.filename]
    if backend and backend[-1] is not frames[-1]:
        here.append(f"torch_neuron/{os.path.basename(backend[-1].filename)}:{backend[-1].lineno}")
    return " / ".join(here)


def _max_error(got: torch.Tensor, want: torch.Tensor) -> str:
    try:
        torch.testing.assert_close(got, want, **TOL)
    except AssertionError:
        nans = int(got.isnan().sum()) - int(want.isnan().sum())
        if nans > 0:
            return f"{nans} more NaN than the CPU's"
        err = (got.double() - want.double()).abs().nan_to_num(float("inf")).max().item()
        return f"max abs error {err:.3g} (|ref| max {want.abs().max().item():.3g})"
    return ""


def _logits(model, ids, mask, **kw):
    return model(input_ids=ids, attention_mask=mask, **kw).logits


def stage_forward(cpu, dev, ids, mask) -> str:
    with torch.no_grad():
        want = on_cpu(_logits, cpu, ids, mask)
        got = _logits(dev, ids.to(DEV), mask.to(DEV)).cpu()
    if got.shape != want.shape:
        return f"logits shape {tuple(got.shape)} != {tuple(want.shape)}"
    return _max_error(got.float(), want.float())


# Architectures whose backward needs train mode and no cache (their eval-mode forward updates the recurrent
# state in place or asserts training); their dropout probabilities are 0 (zoo_config): train mode stays
# deterministic.
TRAIN_MODE_BACKWARD = {
    "reformer": "its reversible layers recompute activations in backward only in train mode (asserted)",
    "rwkv": "in eval mode its forward writes the recurrent state in place, which autograd refuses",
    "xlstm": "in eval mode its forward writes the recurrent state in place, which autograd refuses",
}


def stage_backward(cpu, dev, ids, mask) -> str:
    """Gradients of every parameter for a cross-entropy of the logits against the next tokens."""
    targets = torch.roll(ids, -1, dims=1)
    train = type(cpu).__name__ in {model_class_name(arch) for arch in TRAIN_MODE_BACKWARD}

    def loss_backward(model, device):
        model.zero_grad(set_to_none=True)
        model.train(train)
        # a training forward keeps no cache (recurrent models would write their state in place)
        logits = _logits(model, ids.to(device), mask.to(device), **({"use_cache": False} if train else {}))
        F.cross_entropy(logits.float().flatten(0, -2), targets.to(device).flatten()).backward()

    try:
        on_cpu(loss_backward, cpu, "cpu")
        loss_backward(dev, DEV)
    finally:
        cpu.eval()
        dev.eval()
    dev_params = dict(dev.named_parameters())
    for name, p in cpu.named_parameters():
        q = dev_params[name]
        if (p.grad is None) != (q.grad is None):
            return f"gradient of {name}: {'missing' if q.grad is None else 'unexpected'} on {DEV}"
        if p.grad is not None and (err := _max_error(q.grad.cpu().float(), p.grad.float())):
            return f"gradient of {name}: {err}"
    return ""


def _generate(model, ids, mask):
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else model.generation_config.eos_token_id
    if isinstance(pad, list):
        pad = pad[0]
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                         do_sample=False, num_beams=1, num_return_sequences=1, pad_token_id=pad,
                         output_scores=True, return_dict_in_generate=True)
    # multi-codebook decoders return [batch, codebooks, length]: one row per codebook
    sequences = out.sequences.reshape(-1, out.sequences.shape[-1])
    return sequences.cpu(), [s.cpu().float().reshape(-1, s.shape[-1]) for s in out.scores]


def stage_generate(cpu, dev, ids, mask) -> str:
    """Greedy tokens must agree; where they first differ, the device's token must tie the CPU's best score
    within the tolerance (random tiny models have near-equal logits; rounding may pick either)."""
    with torch.no_grad():
        want, want_scores = on_cpu(_generate, cpu, ids, mask)
        got, got_scores = _generate(dev, ids.to(DEV), mask.to(DEV))
    if got.shape != want.shape:
        return f"sequence shape {tuple(got.shape)} != {tuple(want.shape)}"
    diverged: set[int] = set()  # rows past a tie: their later steps see different prefixes
    for step, (gs, ws) in enumerate(zip(got_scores, want_scores)):
        col = ids.shape[1] + step
        rows = [r for r in range(got.shape[0]) if r not in diverged]
        if err := _max_error(gs[rows], ws[rows]):
            return f"scores of step {step}: {err}"
        for row in rows:
            if got[row, col] != want[row, col]:
                best, chosen = ws[row].max(), ws[row, got[row, col]]
                if best - chosen > TOL["atol"] + TOL["rtol"] * best.abs():
                    return f"token {step} of row {row}: {got[row, col].item()} != {want[row, col].item()} " \
                           f"(CPU scores {chosen.item():.6g} vs best {best.item():.6g})"
                diverged.add(row)
    return ""


def run(arch: str) -> ZooResult:
    """Build ``arch`` tiny, run the three stages on ``neuron`` and the CPU, and classify."""
    start = time.time()
    result = ZooResult(arch)
    try:
        cpu, result.params = build(arch)
    except NotApplicable as e:
        result.forward = result.backward = result.generate = "n/a"
        result.reason = str(e)
        return result
    except Exception as e:  # noqa: BLE001 - the reason is the report
        result.forward = result.backward = result.generate = "fail"
        result.reason = f"build: {_first_line(e)}"
        return result
    try:
        dev = copy.deepcopy(cpu).to(DEV)
        ids, mask = prompt(cpu)
    except Exception as e:  # noqa: BLE001
        result.forward = result.backward = result.generate = "fail"
        result.reason = f"moving the model to {DEV} or making its prompt: {_first_line(e)} at {_where(e)}"
        return result
    torch.neuron.reset_metrics()
    reasons = []
    for stage, fn in (("forward", stage_forward), ("backward", stage_backward), ("generate", stage_generate)):
        try:
            problem = fn(cpu, dev, ids, mask)
        except CpuReferenceError as e:
            problem = str(e)
        except Exception as e:  # noqa: BLE001
            problem = f"{_first_line(e)} at {_where(e)}"
        setattr(result, stage, "fail" if problem else "pass")
        if problem:
            reasons.append(f"{stage}: {problem}")
    result.fallback = sorted(torch.neuron.metrics()["fallback"])
    result.reason = "; ".join(reasons)
    result.seconds = round(time.time() - start, 1)
    return result


def architectures() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
