"""A small character-level transformer language model on the text shipped beside this script."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import shoal.train as st

CORPUS = Path(__file__).with_name("corpus.txt")


class CharTransformer(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(context, dim))
        block = nn.TransformerEncoderLayer(
            dim, nhead=4, dim_feedforward=4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        h = self.embed(tokens) + self.position[:length]
        h = self.blocks(h, mask=self.mask[:length, :length], is_causal=True)
        return self.head(h)


def windows(text: str, context: int, stride: int) -> tuple[TensorDataset, int]:
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text])
    starts = range(0, len(ids) - context - 1, stride)
    x = torch.stack([ids[s : s + context] for s in starts])
    y = torch.stack([ids[s + 1 : s + context + 1] for s in starts])
    return TensorDataset(x, y), len(vocab)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="initial global batch size")
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=None, help="stop early (smoke tests)")
    args = parser.parse_args(argv)

    st.init()
    data, vocab = windows(CORPUS.read_text(), args.context, stride=8)
    torch.manual_seed(0)
    model = CharTransformer(vocab, args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)  # sqrt rule
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    loader = st.ElasticDataLoader(data, args.batch_size, max_batch_size=args.max_batch_size)
    trainer = st.ElasticTrainer(model, optimizer, lr_scheduler=scheduler)

    for epoch in st.epochs(args.epochs):
        total, count = 0.0, 0
        for tokens, targets in loader:
            logits = trainer.model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            trainer.backward(loss)
            trainer.step()
            total, count = total + loss.item(), count + 1
            if args.max_steps and trainer.steps >= args.max_steps:
                break
        scheduler.step()
        mean = total / max(count, 1)
        st.log(f"epoch {epoch} loss {mean:.3f} bits/char {mean / math.log(2):.2f} "
               f"{trainer.describe()}")
        if args.max_steps and trainer.steps >= args.max_steps:
            break
    st.shutdown()


if __name__ == "__main__":
    main()
