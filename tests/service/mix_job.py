"""A small elastic job for the simulator-versus-real test: regression with a device-like cost.

Each micro-batch costs ``--cost-fixed + --cost-per-sample * samples`` seconds of sleep before
its backward pass, inside the step the library times, so step times behave like an accelerator's
(larger micro-batches are cheaper per sample, replicas run in parallel) and stay the same on a
loaded 2-core machine. Everything else is real: processes, DDP over gloo, checkpoints, resizes,
reports to the service.

    python tests/service/mix_job.py --epochs 6 --samples 512
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import shoal.train as st


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--cost-fixed", type=float, default=0.03)
    parser.add_argument("--cost-per-sample", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    st.init(report_interval_s=1.0)
    generator = torch.Generator().manual_seed(args.seed)
    features = torch.randn(args.samples, 16, generator=generator)
    weights = torch.randn(16, 1, generator=generator)
    targets = features @ weights + 0.5 * torch.randn(args.samples, 1, generator=generator)
    loader = st.ElasticDataLoader(TensorDataset(features, targets), args.batch_size,
                                  max_batch_size=args.max_batch_size, seed=args.seed)
    torch.manual_seed(args.seed)
    model = nn.Linear(16, 1)
    trainer = st.ElasticTrainer(model, torch.optim.SGD(model.parameters(), lr=0.02))
    for epoch in st.epochs(args.epochs):
        loss = torch.tensor(float("nan"))  # an epoch resumed at its end has no batch
        for x, y in loader:
            loss = nn.functional.mse_loss(trainer.model(x), y)
            time.sleep(args.cost_fixed + args.cost_per_sample * len(x))
            trainer.backward(loss)
            trainer.step()
        st.log(f"epoch {epoch} loss {loss.item():.4f} {trainer.describe()}")
    st.shutdown()


if __name__ == "__main__":
    main()
