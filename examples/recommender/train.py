"""A neural collaborative-filtering model on synthetic user-item interactions.

Users and items have hidden 8-dimensional tastes; a user clicks an item with probability
sigmoid(taste_u . taste_i). The model learns embeddings plus an MLP from 120,000 such clicks.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

import shoal.train as st

NUM_USERS, NUM_ITEMS, TASTE_DIM = 500, 200, 8


def synthetic_interactions(count: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    users_taste = torch.randn(NUM_USERS, TASTE_DIM, generator=g)
    items_taste = torch.randn(NUM_ITEMS, TASTE_DIM, generator=g)
    users = torch.randint(0, NUM_USERS, (count,), generator=g)
    items = torch.randint(0, NUM_ITEMS, (count,), generator=g)
    p = torch.sigmoid((users_taste[users] * items_taste[items]).sum(1))
    clicks = torch.bernoulli(p, generator=g)
    return TensorDataset(users, items, clicks)


class NeuralCF(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.users = nn.Embedding(NUM_USERS, dim)
        self.items = nn.Embedding(NUM_ITEMS, dim)
        self.mlp = nn.Sequential(nn.Linear(3 * dim, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        u, i = self.users(users), self.items(items)
        return self.mlp(torch.cat([u, i, u * i], dim=1)).squeeze(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=256, help="initial global batch size")
    parser.add_argument("--max-batch-size", type=int, default=4096)
    parser.add_argument("--max-steps", type=int, default=None, help="stop early (smoke tests)")
    args = parser.parse_args(argv)

    st.init()
    data = synthetic_interactions(140_000, seed=0)
    train = TensorDataset(*(t[:120_000] for t in data.tensors))
    test = [t[120_000:] for t in data.tensors]

    torch.manual_seed(0)
    model = NeuralCF()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)  # square-root LR scaling
    loader = st.ElasticDataLoader(train, args.batch_size, max_batch_size=args.max_batch_size)
    trainer = st.ElasticTrainer(model, optimizer)

    for epoch in st.epochs(args.epochs):
        loss = torch.tensor(float("nan"))  # an epoch resumed at its end has no batch
        for users, items, clicks in loader:
            loss = nn.functional.binary_cross_entropy_with_logits(
                trainer.model(users, items), clicks
            )
            trainer.backward(loss)
            trainer.step()
            if args.max_steps and trainer.steps >= args.max_steps:
                break
        with torch.no_grad():
            logits = model(test[0], test[1])
            accuracy = ((logits > 0).float() == test[2]).float().mean().item()
        st.log(f"epoch {epoch} loss {loss.item():.4f} test_acc {accuracy:.3f} {trainer.describe()}")
        if args.max_steps and trainer.steps >= args.max_steps:
            break
    st.shutdown()


if __name__ == "__main__":
    main()
