"""A GPT trained under the parallel plan shoal chose for its allocation.

The job declares its architecture (``model`` in ``job.yaml``) instead of being profiled. For
every allocation it considers, shoal's planner finds the fastest data-parallel plan (ZeRO stage,
offload, recomputation, micro-batch and accumulation) that fits the devices' memory; the
scheduler ranks allocations by those plans, and the backend hands each process the plan of the
allocation it runs on in ``SHOAL_PLAN``. This script reads it with ``shoal.train.get_plan``,
applies it with ``shoal.train.apply_plan`` and trains ``ReferenceGPT`` to predict the next token
of a fixed set of random sequences until the job's target tokens are done. Rank 0 writes
``result.json`` (the plan, the losses, the world size) into ``SHOAL_CHECKPOINT_DIR``, or to
``--out``.

The job is elastic: it writes the full (unsharded) model and optimizer state every
``SHOAL_CHECKPOINT_INTERVAL`` seconds and when asked to stop (SIGTERM, a resize), then exits with
``shoal.train.EXIT_CHECKPOINTED``. The next run, on any number of devices and under the plan of
its new allocation, loads that state (``AppliedPlan.load_full_state``) and continues from the
step it stopped at. It reports the samples it has trained, which is the job's progress.

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
import time
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.perf.catalog import parse_model
from shoal.train import EXIT_CHECKPOINTED, apply_plan, get_plan
from shoal.train.plan import ReferenceGPT
from shoal.train.report import Reporter
from shoal.train.signals import ResizeSignal

STATE_FILE = "plan_state.pt"


def _agree(flags: list[bool], world: int) -> list[bool]:
    """Each flag true on any rank, on every rank: all ranks stop or save at the same step."""
    if world == 1:
        return flags
    values = torch.tensor([float(f) for f in flags])
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(v) for v in values]


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
    checkpoint_dir = os.environ.get("SHOAL_CHECKPOINT_DIR")
    state_path = Path(checkpoint_dir) / STATE_FILE if checkpoint_dir else None
    interval = float(os.environ.get("SHOAL_CHECKPOINT_INTERVAL", "30"))
    stop = ResizeSignal(Path(checkpoint_dir) if checkpoint_dir else None)
    reporter = Reporter(os.environ.get("SHOAL_SCHEDULER_URL"), os.environ.get("SHOAL_JOB", ""))
    done, losses, runs = 0, [], []
    if state_path is not None and state_path.exists():
        saved = torch.load(state_path, weights_only=False) if applied.rank == 0 else None
        meta = [saved["meta"] if saved else None]
        if world > 1:
            dist.broadcast_object_list(meta, src=0)
        done, losses, runs = meta[0]["step"], meta[0]["losses"], meta[0]["runs"]
        applied.load_full_state(optimizer, saved["state"] if saved else None)
    runs.append({"world_size": world, "plan": dataclasses.asdict(plan), "first_step": done + 1})

    def checkpoint() -> None:
        state = applied.full_state(optimizer)
        if applied.rank == 0 and state_path is not None:
            meta = {"step": done, "losses": losses, "runs": runs}
            tmp = state_path.with_suffix(".tmp")
            torch.save({"meta": meta, "state": state}, tmp)
            os.replace(tmp, state_path)

    # One global batch of sequences, learned by heart: the loss falls within a few steps.
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab, (args.batch_size, config.seq), generator=generator)
    batch = (tokens, torch.roll(tokens, -1, dims=1))
    steps = math.ceil(args.tokens / (config.seq * args.batch_size))
    steps = min(steps, args.max_steps or steps)
    last_save = time.monotonic()
    while done < steps:
        losses.append(float(applied.step(applied.local_share(batch), optimizer)))
        done += 1
        if applied.rank == 0:
            print(f"step={done} loss={losses[-1]:.4f}", flush=True)
            reporter.submit({"steps": done, "samples": done * args.batch_size,
                             "batch_size": args.batch_size})
        due = state_path is not None and time.monotonic() - last_save >= interval
        stopping, saving = _agree([stop.requested(), due], world)
        if stopping and state_path is not None:
            checkpoint()
            stop.clear_file()
            reporter.close()
            raise SystemExit(EXIT_CHECKPOINTED)
        if saving:
            checkpoint()
            last_save = time.monotonic()

    if applied.rank == 0:
        reporter.submit({"steps": done, "samples": done * args.batch_size, "done": True})
        reporter.close()
        # Outside shoal and without --out there is nowhere of the job's own to write to.
        out = args.out or (Path(checkpoint_dir) / "result.json" if checkpoint_dir else None)
        if out is not None:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps({
                "plan": dataclasses.asdict(plan), "sharding": applied.sharding,
                "world_size": world, "steps": done, "losses": losses, "runs": runs}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
