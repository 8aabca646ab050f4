"""A small module factory for ``shoal plan --module`` tests."""

from __future__ import annotations

import torch
from torch import nn


def factory() -> tuple[nn.Module, object]:
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 10))

    def make_inputs(batch: int) -> tuple[torch.Tensor]:
        return (torch.randn(batch, 256),)

    return model, make_inputs
