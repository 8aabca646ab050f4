"""The reference GPT whose memory the planner's formulas describe exactly.

``ReferenceGPT`` follows the layout of Korthikanti et al. 2022 (pre-norm blocks, one QKV
projection, a 4h GELU MLP, dropout after attention probabilities, attention output and MLP, a tied
output layer and a float32 cross-entropy), with dropout through ``torch.native_dropout`` so every
mask is one byte as the formulas assume. Full recomputation (``torch.utils.checkpoint``) is
switched on per layer through ``full_recompute`` and selective recomputation of the attention core
through ``Block.selective``. ``shoal.train.apply.apply_plan`` applies a whole plan (recomputation,
FSDP / ZeRO sharding, micro-batching with accumulation) to this or any other model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from shoal.perf.models import GPTConfig


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


class AttentionCore(nn.Module):
    """softmax(QK^T / sqrt(d) + causal) dropout, times V: what selective recompute redoes."""

    def __init__(self, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.dropout = dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                causal_bias: torch.Tensor) -> torch.Tensor:
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale + causal_bias
        probs = _dropout(torch.softmax(scores, dim=-1), self.dropout, self.training)
        return torch.matmul(probs, v)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, dropout: float):
        super().__init__()
        h = config.hidden
        self.heads = config.heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.core = AttentionCore(config.heads, dropout)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        self.selective = False

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        return x.view(b, s, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, causal_bias: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        # q, k and v stay views of one QKV output, so selective recompute keeps exactly 3sbh.
        q, k, v = (self._split_heads(t) for t in self.qkv(self.ln1(x)).split(h, dim=-1))
        if self.selective and self.training:
            context = checkpoint(self.core, q, k, v, causal_bias, use_reentrant=False)
        else:
            context = self.core(q, k, v, causal_bias)
        context = context.transpose(1, 2).reshape(b, s, h)
        x = x + _dropout(self.proj(context), self.dropout, self.training)
        mlp = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + _dropout(mlp, self.dropout, self.training)


class ReferenceGPT(nn.Module):
    """A GPT laid out as the memory formulas assume; ``forward(tokens, targets)`` gives the loss."""

    def __init__(self, config: GPTConfig, dropout: float = 0.1):
        super().__init__()
        self.config = config
        self.dropout = dropout
        self.wte = nn.Embedding(config.vocab, config.hidden)
        self.wpe = nn.Embedding(config.seq, config.hidden)
        self.blocks = nn.ModuleList(Block(config, dropout) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.hidden)
        self.register_buffer(
            "causal_bias",
            torch.full((config.seq, config.seq), float("-inf")).triu(1),
            persistent=False,
        )
        self.full_recompute: set[int] = set()

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        positions = torch.arange(s, device=tokens.device)
        x = _dropout(self.wte(tokens) + self.wpe(positions), self.dropout, self.training)
        bias = self.causal_bias[:s, :s].to(x.dtype)
        for index, block in enumerate(self.blocks):
            if index in self.full_recompute and self.training:
                x = checkpoint(block, x, bias, use_reentrant=False)
            else:
                x = block(x, bias)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def random_batch(config: GPTConfig, batch: int, generator: torch.Generator | None = None,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    shape = (batch, config.seq)
    tokens = torch.randint(0, config.vocab, shape, generator=generator, device=device)
    targets = torch.randint(0, config.vocab, shape, generator=generator, device=device)
    return tokens, targets
