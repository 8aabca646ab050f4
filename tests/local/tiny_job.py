"""A tiny elastic training job for the service tests: linear regression, a few seconds.

Arguments: ``--epochs N --sleep S`` (seconds per step, leaves time to resize and kill it).
Writes ``done.json`` (steps, samples, world size at the end) into its checkpoint directory.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import shoal.train as st


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.05)
    args = parser.parse_args()
    ctx = st.init(report_interval_s=0.5)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(256, 8, generator=generator)
    targets = features @ torch.randn(8, 1, generator=generator)
    loader = st.ElasticDataLoader(TensorDataset(features, targets), 16, max_batch_size=64,
                                  max_local_bsz=32)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    trainer = st.ElasticTrainer(model, torch.optim.SGD(model.parameters(), lr=0.05))
    if ctx.restored:
        st.log(f"restored at step {trainer.steps}")
    for epoch in st.epochs(args.epochs):
        for x, y in loader:
            trainer.backward(nn.functional.mse_loss(trainer.model(x), y))
            if trainer.step():
                time.sleep(args.sleep)
        st.log(f"epoch {epoch} done: {trainer.describe()}")
    if ctx.rank == 0 and ctx.env.checkpoint_dir is not None:
        summary = {"steps": trainer.steps, "samples": trainer.samples,
                   "world_size": ctx.world_size, "pid": os.getpid()}
        Path(ctx.env.checkpoint_dir, "done.json").write_text(json.dumps(summary))
    st.shutdown()


if __name__ == "__main__":
    main()
