"""Reference models in plain PyTorch, used by the tests, the demo and the bench."""

from .gpt import GPT, GPTConfig, batches, markov_tokens

__all__ = ["GPT", "GPTConfig", "batches", "markov_tokens"]
