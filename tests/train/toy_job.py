"""A tiny elastic training job the process tests start, resize, kill and compare.

Environment (besides shoal's contract): TOY_OUT (folder for records), TOY_SLEEP (seconds per
step, to leave time for a signal), TOY_EPOCHS, TOY_CKPT_STEPS (periodic checkpoint interval).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import shoal.train as st

NUM_SAMPLES = 97  # a short last batch of 1 sample: one rank gets a padding micro-batch at WS=2
BATCH_SIZE = 12
MAX_LOCAL_BSZ = 4  # 3 micro-steps at WS=1, 2 at WS=2


def main() -> None:
    out = Path(os.environ["TOY_OUT"])
    sleep = float(os.environ.get("TOY_SLEEP", "0"))
    num_epochs = int(os.environ.get("TOY_EPOCHS", "3"))
    ckpt_steps = os.environ.get("TOY_CKPT_STEPS")
    ctx = st.init(
        checkpoint_interval_s=None,
        checkpoint_interval_steps=int(ckpt_steps) if ckpt_steps else None,
    )
    pid = os.getpid()
    if ctx.restored:
        (out / f"restored-{pid}.json").write_text(json.dumps(ctx.checkpoint.meta))

    generator = torch.Generator().manual_seed(1234)
    features = torch.randn(NUM_SAMPLES, 8, generator=generator)
    targets = features @ torch.randn(8, 1, generator=generator) + 0.1 * torch.randn(
        NUM_SAMPLES, 1, generator=generator
    )
    ids = torch.arange(NUM_SAMPLES)
    dataset = TensorDataset(features, targets, ids)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    loader = st.ElasticDataLoader(
        dataset, BATCH_SIZE, max_local_bsz=MAX_LOCAL_BSZ, seed=7, stats_split_every=0
    )
    trainer = st.ElasticTrainer(model, optimizer, lr_scheduler=scheduler, lr_scaling="none")

    record = (out / f"samples-rank{ctx.rank}-{pid}.txt").open("a")
    for epoch in st.epochs(num_epochs):
        for x, y, batch_ids in loader:
            seen = set(loader.sample_indices)
            assert seen == {int(i) for i in batch_ids} or not seen
            for i in loader.sample_indices:
                record.write(f"{epoch} {i}\n")
            loss = nn.functional.mse_loss(trainer.model(x), y)
            trainer.backward(loss)
            if trainer.step():
                record.flush()
                if ctx.rank == 0:
                    (out / "progress").write_text(str(trainer.steps))
                time.sleep(sleep)
        scheduler.step()
    record.close()
    if ctx.rank == 0:
        torch.save(model.state_dict(), out / "final.pt")
        stats = trainer.grad_stats
        summary = {
            "steps": trainer.steps,
            "samples": trainer.samples,
            "grad_sqr": stats.sqr if stats else None,
            "grad_var": stats.var if stats else None,
            "profile": trainer.profile.rows(),
        }
        (out / "summary.json").write_text(json.dumps(summary))
    st.shutdown()


if __name__ == "__main__":
    main()
