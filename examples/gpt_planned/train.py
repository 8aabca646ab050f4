"""A GPT trained under the parallel plan shoal chose for its allocation.

The job declares its architecture (``model`` in ``job.yaml``) instead of being profiled. For
every allocation it considers, shoal's planner finds the fastest data-parallel plan (ZeRO stage,
offload, recomputation, micro-batch and accumulation) that fits the devices' memory; the
scheduler ranks allocations by those plans, and the backend hands each process the plan of the
allocation it runs on in ``SHOAL_PLAN``. ``shoal.train.PlannedTrainer`` reads and applies it and
trains ``ReferenceGPT`` to predict the next token of a fixed set of random sequences until the
job's target tokens are done. Rank 0 writes ``result.json`` (the plan of each run, the losses)
into ``SHOAL_CHECKPOINT_DIR``, or to ``--out``.

The job is elastic: the trainer checkpoints the unsharded model and optimizer state every
``SHOAL_CHECKPOINT_INTERVAL`` seconds and when asked to stop (SIGTERM, a resize), then exits with
``shoal.train.EXIT_CHECKPOINTED``; the next run, on any number of devices and under the plan of
its new allocation, continues from the step it stopped at.

Outside shoal the plan is plain data parallelism with ``--micro-batch`` (default: the whole
local batch at once):

    torchrun --nproc_per_node 2 examples/gpt_planned/train.py --micro-batch 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

import shoal.train as st
from shoal.perf.catalog import parse_model
from shoal.train.plan import ReferenceGPT


class Losses(list):
    """The loss of every step, kept in the job's checkpoint."""

    def state_dict(self) -> list[float]:
        return list(self)

    def load_state_dict(self, state: list[float]) -> None:
        self[:] = state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128")
    parser.add_argument("--batch-size", type=int, default=8, help="global batch in sequences")
    parser.add_argument("--tokens", type=int, default=32 * 8 * 20, help="tokens to train on")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="the plan outside shoal: data parallel with this micro-batch")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-steps", type=int, default=None, help="stop early (smoke tests)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    ctx = st.init(checkpoint_interval_s=30)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    config = parse_model(args.model)
    torch.manual_seed(0)
    trainer = st.PlannedTrainer(ReferenceGPT(config, dropout=0.0), torch.optim.AdamW,
                                global_batch=args.batch_size, micro_batch=args.micro_batch,
                                lr=args.lr)
    losses = Losses()
    trainer.register("losses", losses)

    # One global batch of sequences, learned by heart: the loss falls within a few steps.
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab, (args.batch_size, config.seq), generator=generator)
    batch = (tokens, torch.roll(tokens, -1, dims=1))
    steps = math.ceil(args.tokens / (config.seq * args.batch_size))
    steps = min(steps, args.max_steps or steps)
    while trainer.steps < steps:
        losses.append(trainer.step(trainer.local_share(batch)))
        st.log(f"step={trainer.steps} loss={losses[-1]:.4f}")

    checkpoint_dir = ctx.env.checkpoint_dir
    # Outside shoal and without --out there is nowhere of the job's own to write to.
    out = args.out or (Path(checkpoint_dir) / "result.json" if checkpoint_dir else None)
    if ctx.rank == 0 and out is not None:
        result: dict[str, Any] = {"plan": trainer.runs[-1]["plan"],
                                  "sharding": trainer.applied.sharding,
                                  "world_size": ctx.world_size, "steps": trainer.steps,
                                  "losses": list(losses), "runs": trainer.runs}
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result))
    st.shutdown()


if __name__ == "__main__":
    main()
