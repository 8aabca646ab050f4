"""A GPT trained under the parallel plan shoal chose for its allocation.

The job declares its architecture (``model`` in ``job.yaml``) instead of being profiled. For
every allocation it considers, shoal's planner finds the fastest data-parallel plan (ZeRO stage,
offload, recomputation, micro-batch and accumulation) that fits the devices' memory; the
scheduler ranks allocations by those plans, and the backend hands each process the plan of the
allocation it runs on in ``SHOAL_PLAN``. This script reads it with ``shoal.train.get_plan``,
applies it with ``shoal.train.apply_plan`` and trains ``ReferenceGPT`` to predict the next token
of a fixed set of random sequences until the job's target tokens are done. Rank 0 writes
``result.json`` (the plan, the losses, the world size) into ``SHOAL_CHECKPOINT_DIR`` (or
``--out``).

This example does not checkpoint: a run that is stopped (a resize) starts again from step 0.

Outside shoal the plan is plain data parallelism with ``--micro-batch`` (default: the whole
local batch at once):

    torchrun --nproc_per_node 2 examples/gpt_planned/train.py --micro-batch 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.perf.catalog import parse_model
from shoal.train import apply_plan, get_plan
from shoal.train.plan import ReferenceGPT


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

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = args.batch_size // world
    micro = args.micro_batch or local
    plan = get_plan({"dp": world, "micro_batch": micro, "accumulation": max(1, local // micro)})
    if plan.global_batch != args.batch_size or plan.dp != world:
        raise SystemExit(f"the plan (dp {plan.dp}, global batch {plan.global_batch}) does not "
                         f"match this run (world {world}, --batch-size {args.batch_size})")

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if world > 1:
        dist.init_process_group("gloo")
    config = parse_model(args.model)
    torch.manual_seed(0)
    applied = apply_plan(ReferenceGPT(config, dropout=0.0), plan)
    optimizer = applied.optimizer(torch.optim.AdamW, lr=args.lr)
    # One global batch of sequences, learned by heart: the loss falls within a few steps.
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab, (args.batch_size, config.seq), generator=generator)
    batch = (tokens, torch.roll(tokens, -1, dims=1))
    steps = math.ceil(args.tokens / (config.seq * args.batch_size))
    steps = min(steps, args.max_steps or steps)
    losses = []
    for step in range(1, steps + 1):
        losses.append(float(applied.step(applied.local_share(batch), optimizer)))
        if applied.rank == 0:
            print(f"step={step} loss={losses[-1]:.4f}", flush=True)

    if applied.rank == 0:
        out = Path(args.out or Path(os.environ.get("SHOAL_CHECKPOINT_DIR", ".")) / "result.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"plan": dataclasses.asdict(plan), "sharding": applied.sharding,
                                   "world_size": world, "steps": steps, "losses": losses}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
