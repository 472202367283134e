"""A small GPT-style language model in plain PyTorch (nothing neuron-specific).

Token + learned position embeddings, ``n_layer`` pre-norm blocks (causal self-attention through
``F.scaled_dot_product_attention``, a GELU MLP), a final LayerNorm and an LM head tied to the
token embedding. It is the model the tests, the demo and the bench train on the ``neuron`` device
and on the CPU, so it must run unchanged on any device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 16  # the longest context (positions)
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd {cfg.n_embd} is not a multiple of n_head {cfg.n_head}")
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        # [B, T, 3C] -> three [B, H, T, C/H]
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4).unbind(0)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one parameter, two uses
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections into the residual stream keeps its variance flat with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits [B, T, vocab] and, given targets [B, T], the mean cross-entropy loss (else None)."""
        t = idx.shape[1]
        if t > self.cfg.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        return logits, loss

    def num_params(self) -> int:
        """Distinct parameters (the tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_step(self, batch: int, seq: int) -> int:
        """Model FLOPs of one training step (forward + backward) on [batch, seq] tokens.

        Counts the matmuls only, as MFU conventionally does: 2 FLOPs per multiply-add forward and twice
        that backward (6 per weight per token) for every weight used in a matmul (all but the embedding
        lookups and the norms; the tied head is a matmul), plus attention's QK^T and PV: 4 * T^2 * C
        per layer and sequence forward, halved because causal attention computes only the lower triangle.
        """
        cfg = self.cfg
        per_layer = 3 * cfg.n_embd * cfg.n_embd + cfg.n_embd * cfg.n_embd + 8 * cfg.n_embd * cfg.n_embd
        matmul_weights = cfg.n_layer * per_layer + cfg.vocab_size * cfg.n_embd
        dense = 6 * matmul_weights * batch * seq
        attention = 3 * cfg.n_layer * batch * 2 * seq * seq * cfg.n_embd
        return dense + attention


def markov_tokens(vocab_size: int, n: int, *, seed: int = 0, branching: int = 3) -> torch.Tensor:
    """``n`` tokens (int64) from a fixed random Markov chain in which each token has ``branching``
    likely successors: a corpus with structure a small model learns within a few steps (the loss
    falls from ln(vocab) towards the chain's entropy), generated on the CPU and reproducible."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(vocab_size, (vocab_size, branching), generator=g)
    choices = torch.randint(branching, (n,), generator=g)
    table, picks = successors.tolist(), choices.tolist()
    out = [int(torch.randint(vocab_size, (1,), generator=g))]
    for i in range(n - 1):
        out.append(table[out[-1]][picks[i]])
    return torch.tensor(out, dtype=torch.int64)


def batches(tokens: torch.Tensor, batch: int, seq: int, steps: int, *, seed: int = 0):
    """``steps`` (inputs, targets) pairs of [batch, seq] windows from ``tokens`` (targets shifted by one)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(len(tokens) - seq - 1, (batch,), generator=g)
        window = torch.stack([tokens[s:s + seq + 1] for s in start.tolist()])
        yield window[:, :-1].contiguous(), window[:, 1:].contiguous()
