"""The representative subset of the Transformers model zoo on ``neuron`` against the CPU: for the most used
causal-LM families, a tiny random model (from the architecture's default config, shrunk offline) gives the same
logits, the same gradients of every parameter and the same greedy ``generate()`` tokens on the device as on the
CPU. The whole mapping is ``nox -s zoo`` (bench/zoo.py, table in docs/zoo.md); the harness is
torch_neuron_testing/zoo.py and zoo_config.py."""

import os

import pytest

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny configs are built locally: nothing may be downloaded

from torch_neuron_testing import zoo  # noqa: E402
from torch_neuron_testing.zoo_config import VALUES, tiny_config  # noqa: E402

SUBSET = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "gpt2", "gpt_neox",
          "falcon", "opt", "bloom", "mixtral", "qwen2_moe", "qwen3_moe", "mamba", "gptj", "starcoder2", "olmo2",
          "deepseek_v3"]


@pytest.mark.parametrize("arch", SUBSET)
def test_forward_backward_and_generate_match_cpu(arch):
    result = zoo.run(arch)
    assert result.passed, f"{arch}: {result.reason}"


def test_shrunk_configs_are_tiny_and_keep_their_layer_pattern():
    """gemma3's sliding/full pattern survives with both kinds; sizes are the small family values."""
    config = tiny_config("gemma3_text")
    assert config.num_hidden_layers == len(config.layer_types) == 2
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    assert config.hidden_size == VALUES["hidden"] and config.vocab_size == VALUES["vocab"]
    model, params = zoo.build("mixtral")
    assert params < zoo.MAX_PARAMS and model.config.num_local_experts == VALUES["experts"]


def test_a_wrong_device_result_is_reported_as_a_failure(monkeypatch):
    """The comparison can fail: logits off by more than the tolerance on the device are named with the stage."""
    real = zoo._logits

    def skewed(model, ids, mask):
        out = real(model, ids, mask)
        return out * 1.001 if out.device.type == zoo.DEV else out

    monkeypatch.setattr(zoo, "_logits", skewed)
    result = zoo.run("llama")
    assert result.forward == "fail" and "max abs error" in result.reason
