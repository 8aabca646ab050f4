"""An MLP on scikit-learn's bundled handwritten digits (1,797 8x8 images), elastic under shoal."""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import shoal.train as st


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32, help="initial global batch size")
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--max-steps", type=int, default=None, help="stop early (smoke tests)")
    args = parser.parse_args(argv)

    st.init()
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    train, test = TensorDataset(x[:1500], y[:1500]), (x[1500:], y[1500:])

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # square-root LR scaling
    loader = st.ElasticDataLoader(train, args.batch_size, max_batch_size=args.max_batch_size)
    trainer = st.ElasticTrainer(model, optimizer)

    for epoch in st.epochs(args.epochs):
        loss = torch.tensor(float("nan"))  # an epoch resumed at its end has no batch
        for images, labels in loader:
            loss = nn.functional.cross_entropy(trainer.model(images), labels)
            trainer.backward(loss)
            trainer.step()
            if args.max_steps and trainer.steps >= args.max_steps:
                break
        with torch.no_grad():
            accuracy = (model(test[0]).argmax(1) == test[1]).float().mean().item()
        st.log(f"epoch {epoch} loss {loss.item():.4f} test_acc {accuracy:.3f} {trainer.describe()}")
        if args.max_steps and trainer.steps >= args.max_steps:
            break
    st.shutdown()


if __name__ == "__main__":
    main()
