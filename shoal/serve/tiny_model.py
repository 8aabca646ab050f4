"""The model the real server serves: a small transformer classifier with seeded weights.

Defined in code so nothing is downloaded. Inputs are padded to ``SEQ_LEN`` tokens, so a batch's
latency depends only on its size (what the simulator's batch-latency table assumes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from shoal.serve.wire import SEQ_LEN, VOCAB

HIDDEN = 128
HEADS = 4
LAYERS = 2
CLASSES = 10
PAD = 0


class TinyClassifier(nn.Module):
    """Token embedding + learned positions -> transformer encoder -> mean pool -> classes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN, padding_idx=PAD)
        self.position = nn.Parameter(torch.randn(SEQ_LEN, HIDDEN) * 0.02)
        layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, 4 * HIDDEN, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(tokens) + self.position)
        return self.head(hidden.mean(dim=1))


def build_model(seed: int = 0) -> TinyClassifier:
    """The model with weights drawn from ``seed`` (same seed, same weights, same answers)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = TinyClassifier().eval()
    finally:
        torch.random.set_rng_state(generator_state)
    return model


def pad_batch(requests: Sequence[Sequence[int]]) -> torch.Tensor:
    """Token lists (1..SEQ_LEN ids each) as one (batch, SEQ_LEN) tensor, right-padded."""
    batch = torch.full((len(requests), SEQ_LEN), PAD, dtype=torch.long)
    for row, tokens in enumerate(requests):
        batch[row, : len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
    return batch


class Predictor:
    """Runs the model on lists of token lists; returns (label, confidence) per request."""

    def __init__(self, seed: int = 0) -> None:
        self.model = build_model(seed)

    def __call__(self, requests: Sequence[Sequence[int]]) -> list[tuple[int, float]]:
        with torch.inference_mode():
            probs = torch.softmax(self.model(pad_batch(requests)), dim=-1)
        confidence, label = probs.max(dim=-1)
        return list(zip(label.tolist(), confidence.tolist(), strict=True))

