"""A small CNN on the digits images, with random-shift augmentation, SGD + AdaScale."""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import Dataset

import shoal.train as st


class ShiftedDigits(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Digits as 1x8x8 images, each shifted by up to one pixel (a fixed shift per index)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, copies: int) -> None:
        self.images, self.labels, self.copies = images, labels, copies
        generator = torch.Generator().manual_seed(0)
        self.shifts = torch.randint(-1, 2, (len(images) * copies, 2), generator=generator)

    def __len__(self) -> int:
        return len(self.images) * self.copies

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for i in indices:
            dy, dx = self.shifts[i].tolist()
            image = torch.roll(self.images[i % len(self.images)], (dy, dx), dims=(1, 2))
            out.append((image, self.labels[i % len(self.images)]))
        return out


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 2 * 2, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64, help="initial global batch size")
    parser.add_argument("--max-batch-size", type=int, default=512)
    parser.add_argument("--max-steps", type=int, default=None, help="stop early (smoke tests)")
    args = parser.parse_args(argv)

    st.init()
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    train = ShiftedDigits(images[:1500], labels[:1500], copies=4)
    test = (images[1500:], labels[1500:])

    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # AdaScale
    loader = st.ElasticDataLoader(train, args.batch_size, max_batch_size=args.max_batch_size)
    trainer = st.ElasticTrainer(model, optimizer)

    for epoch in st.epochs(args.epochs):
        loss = torch.tensor(float("nan"))  # an epoch resumed at its end has no batch
        for batch_images, batch_labels in loader:
            loss = nn.functional.cross_entropy(trainer.model(batch_images), batch_labels)
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
