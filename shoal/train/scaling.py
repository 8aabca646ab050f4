"""Learning-rate scaling when the global batch size differs from the user's initial one.

``scale = batch_size / init_batch_size``. The factor multiplies every parameter group's
learning rate for one optimizer step only, so a user's LR scheduler keeps working unchanged.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from shoal.perf.efficiency import GradStats, gain

LRScaling = Literal["auto", "adascale", "sqrt", "linear", "none"]
RULES: tuple[str, ...] = ("auto", "adascale", "sqrt", "linear", "none")


def resolve_rule(rule: str, optimizer: torch.optim.Optimizer) -> str:
    """``auto``: AdaScale for SGD, square-root for Adam-style optimizers, else none."""
    if rule not in RULES:
        raise ValueError(f"lr_scaling={rule!r} is not one of {list(RULES)}")
    if rule != "auto":
        return rule
    if isinstance(optimizer, torch.optim.SGD):
        return "adascale"
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return "sqrt"
    return "none"


def adascale_gain(stats: GradStats | None, scale: float) -> float:
    """AdaScale's gain ``(var + sqr) / (var / scale + sqr)``; 1 until noise is measured."""
    if stats is None or scale == 1.0:
        return 1.0
    return float(gain(stats, scale, 1.0))


def lr_factor(rule: str, scale: float, stats: GradStats | None) -> float:
    if rule == "none":
        return 1.0
    if rule == "linear":
        return scale
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "adascale":
        return adascale_gain(stats, scale)
    raise ValueError(f"unresolved lr scaling rule {rule!r}")
