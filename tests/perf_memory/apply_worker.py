"""One rank of a data-parallel run of ``ReferenceGPT`` under ``shoal.train.apply_plan``.

Started once per rank with the torchrun variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) by ``test_apply.py``; the single-process reference runs in the test itself.

    torchrun --nproc_per_node=2 tests/perf_memory/apply_worker.py memory OUT.json
    torchrun --nproc_per_node=2 tests/perf_memory/apply_worker.py trajectory OUT.json
    torchrun --nproc_per_node=2 tests/perf_memory/apply_worker.py memory-all OUT.json  # table
    python tests/perf_memory/apply_worker.py recompute  # one process: the recompute table

``memory`` applies FSDP (ZeRO-3), ZeRO-2, DDP and ZeRO-1 plans and tracks the second training
step with ``MemTracker`` (Adam allocates its state in the first; under DDP the third, as DDP
rebuilds its gradient buckets in the second):
activations saved by the first micro-batch's forward, model states after backward, and the peak.
``trajectory`` trains a dropout-free model for a few steps under every ZeRO stage and records
the loss of the global batch after each step. Each rank writes ``OUT.json.<rank>``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker

from shoal.perf.memory import FP32_ADAM, plan_memory
from shoal.perf.models import GPTConfig
from shoal.train.apply import AppliedPlan, TrainingPlan, apply_plan
from shoal.train.plan import ReferenceGPT, random_batch

# Model states (about 13 MB of fp32 parameters) weigh as much as the activations, so sharding
# and the FSDP buffers move the peak by far more than 5%.
MEMORY_MODEL = GPTConfig(layers=4, hidden=256, heads=4, seq=64, vocab=512)
MEMORY_PLANS = [  # (zero_stage, recompute, micro_batch, accumulation) checked by the tests
    (3, "none", 2, 1),
    (3, "selective", 2, 1),
    (3, "full", 2, 1),
    (3, "none", 2, 2),
    (2, "none", 2, 2),
    (0, "none", 2, 1),
    (1, "none", 2, 1),
]
ALL_PLANS = [  # the table in docs/parallelism.md
    *[(zero, "none", 2, acc) for zero in (0, 1, 2, 3) for acc in (1, 2)],
    (3, "selective", 2, 1), (3, "full", 2, 1), (2, "full", 2, 1),
]
TRAJECTORY_MODEL = GPTConfig(layers=2, hidden=64, heads=2, seq=32, vocab=128)
TRAJECTORY_STEPS = 4
TRAJECTORY_PLAN = {"micro_batch": 2, "accumulation": 2}  # per rank; global batch 8 on 2 ranks
LEARNING_RATE = 1e-2


def _snapshot(tracker: MemTracker, kind: str) -> dict[str, int]:
    totals: dict[str, int] = {}
    for snapshot in tracker.get_tracker_snapshot(kind).values():
        for category, nbytes in snapshot.items():
            name = getattr(category, "value", str(category))
            totals[name] = totals.get(name, 0) + int(nbytes)
    return totals


def _measured_step(applied: AppliedPlan, optimizer: torch.optim.Optimizer,
                   local_batch: Any) -> dict[str, Any]:
    """The step of ``AppliedPlan.step``, with snapshots after the first forward and backward."""
    tracker = MemTracker()
    # ZeroRedundancyOptimizer keeps its state in the local optimizer it wraps.
    tracker.track_external(applied.model, getattr(optimizer, "optim", optimizer))
    after_forward: dict[str, int] = {}
    with tracker:
        for piece, _ in applied.iter_microbatches(local_batch):
            loss = applied.model(*piece)
            after_forward = after_forward or _snapshot(tracker, "current")
            (loss / applied.plan.accumulation).backward()
            tracker.reset_mod_stats()  # MemTracker follows one forward per module at a time
        # Tensors held only by reference cycles are freed whenever the cyclic collector next
        # runs; collect them now so the snapshot is the state that stays resident.
        gc.collect()
        after_backward = _snapshot(tracker, "current")
        optimizer.step()
        applied.zero_grad(optimizer)
    return {"after_forward": after_forward, "after_backward": after_backward,
            "peak": _snapshot(tracker, "peak")}


def run_memory(rank: int, world: int, plans: list[tuple[int, str, int, int]]) -> dict[str, Any]:
    results = []
    for zero, recompute, micro_batch, accumulation in plans:
        plan = TrainingPlan(dp=world, zero_stage=zero, recompute=recompute,
                            micro_batch=micro_batch, accumulation=accumulation)
        torch.manual_seed(0)
        applied = apply_plan(ReferenceGPT(MEMORY_MODEL, dropout=0.1), plan)
        optimizer = applied.optimizer(torch.optim.Adam, lr=1e-4)
        batch = random_batch(MEMORY_MODEL, plan.global_batch, torch.Generator().manual_seed(1))
        local = applied.local_share(batch)
        for _ in range(2 if applied.sharding.startswith("ddp") else 1):
            applied.step(local, optimizer)
        measured = _measured_step(applied, optimizer, local)
        predicted = plan_memory(MEMORY_MODEL, plan.to_parallel_config(FP32_ADAM))
        results.append({
            "zero_stage": zero, "recompute": recompute, "micro_batch": micro_batch,
            "accumulation": accumulation, "sharding": applied.sharding, **measured,
            "predicted": {"params": predicted.params, "grads": predicted.grads,
                          "optimizer": predicted.optimizer,
                          "activations": predicted.activations,
                          "fsdp_buffers": predicted.fsdp_buffers, "peak": predicted.peak},
        })
    return {"rank": rank, "world": world, "plans": results}


def print_table(result: dict[str, Any]) -> None:
    print(f"{'plan':<30} {'sharding':<10} {'activations':>11} {'predicted':>11} {'error':>7} "
          f"{'peak':>11} {'predicted':>11} {'error':>7}")
    for row in result["plans"]:
        name = (f"zero{row['zero_stage']} {row['recompute']} mb{row['micro_batch']} "
                f"acc{row['accumulation']}")
        activations = row["after_forward"]["Activation"]
        peak = row["peak"]["Total"] - row["peak"]["Buffer"]
        predicted = row["predicted"]
        print(f"{name:<30} {row['sharding']:<10} {activations:>11,} "
              f"{predicted['activations']:>11,.0f} "
              f"{activations / predicted['activations'] - 1:>+7.2%} {peak:>11,} "
              f"{predicted['peak']:>11,.0f} {peak / predicted['peak'] - 1:>+7.2%}")


def trajectory(plan: TrainingPlan, steps: int = TRAJECTORY_STEPS,
               **options: Any) -> list[float]:
    """Losses of the global batch after each of ``steps`` Adam steps under ``plan``."""
    torch.manual_seed(0)
    applied = apply_plan(ReferenceGPT(TRAJECTORY_MODEL, dropout=0.0), plan, **options)
    optimizer = applied.optimizer(torch.optim.Adam, lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(steps):
        batch = random_batch(TRAJECTORY_MODEL, plan.global_batch, generator)
        losses.append(float(applied.step(applied.local_share(batch), optimizer)))
    return losses


def run_trajectory(rank: int, world: int) -> dict[str, Any]:
    runs = {}
    for zero in (0, 1, 2, 3):
        plan = TrainingPlan(dp=world, zero_stage=zero, **TRAJECTORY_PLAN)
        runs[f"zero{zero}"] = trajectory(plan)
    plan = TrainingPlan(dp=world, zero_stage=3, **TRAJECTORY_PLAN)
    runs["zero3-sync-once"] = trajectory(plan, sync_every_microbatch=False)
    plan = TrainingPlan(dp=world, zero_stage=3, recompute="full", **TRAJECTORY_PLAN)
    runs["zero3-full-recompute"] = trajectory(plan)
    return {"rank": rank, "world": world, "runs": runs}


RESUME_STEPS = 2  # steps before the checkpoint, and as many after it


def resume_batches(global_batch: int) -> list[Any]:
    generator = torch.Generator().manual_seed(2)
    return [random_batch(TRAJECTORY_MODEL, global_batch, generator)
            for _ in range(2 * RESUME_STEPS)]


def _fresh(plan: TrainingPlan, seed: int) -> tuple[AppliedPlan, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    applied = apply_plan(ReferenceGPT(TRAJECTORY_MODEL, dropout=0.0), plan)
    return applied, applied.optimizer(torch.optim.Adam, lr=LEARNING_RATE)


def _steps(applied: AppliedPlan, optimizer: torch.optim.Optimizer,
           batches: list[Any]) -> list[float]:
    return [float(applied.step(applied.local_share(batch), optimizer)) for batch in batches]


def resume_reference(global_batch: int) -> tuple[list[float], dict[str, Any] | None]:
    """One process, uninterrupted: the losses of every step, and the full state after the
    first ``RESUME_STEPS``."""
    applied, optimizer = _fresh(TrainingPlan(micro_batch=global_batch), seed=0)
    batches = resume_batches(global_batch)
    losses = _steps(applied, optimizer, batches[:RESUME_STEPS])
    state = applied.full_state(optimizer)
    return losses + _steps(applied, optimizer, batches[RESUME_STEPS:]), state


def resume_in_one_process(state: dict[str, Any], global_batch: int) -> list[float]:
    """Load ``state`` into a differently initialised one-process model; train the rest."""
    applied, optimizer = _fresh(TrainingPlan(micro_batch=global_batch), seed=1)
    applied.load_full_state(optimizer, state)
    return _steps(applied, optimizer, resume_batches(global_batch)[RESUME_STEPS:])


def run_resume(rank: int, world: int, out: str) -> dict[str, Any]:
    """Per ZeRO stage: train from scratch and write the full state after ``RESUME_STEPS``
    (``OUT.zeroN.pt``); then load the one-process state ``OUT.single.pt`` into a differently
    initialised model under the same plan and train the remaining steps."""
    single = torch.load(f"{out}.single.pt", weights_only=False) if rank == 0 else None
    runs = {}
    for zero in (0, 1, 2, 3):
        plan = TrainingPlan(dp=world, zero_stage=zero, **TRAJECTORY_PLAN)
        batches = resume_batches(plan.global_batch)
        applied, optimizer = _fresh(plan, seed=0)
        first = _steps(applied, optimizer, batches[:RESUME_STEPS])
        state = applied.full_state(optimizer)
        if rank == 0:
            torch.save(state, f"{out}.zero{zero}.pt")
        applied, optimizer = _fresh(plan, seed=1)
        applied.load_full_state(optimizer, single)
        runs[f"zero{zero}"] = {"first": first,
                               "resumed": _steps(applied, optimizer, batches[RESUME_STEPS:])}
    return {"rank": rank, "world": world, "runs": runs}


def run_rank(task: str, out: str, env: dict[str, str] | None = None) -> None:
    """One rank's whole run; ``env`` (the torchrun variables) is added to the environment."""
    os.environ.update(env or {})
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        if task == "trajectory":
            result = run_trajectory(rank, world)
        elif task == "resume":
            result = run_resume(rank, world, out)
        else:
            result = run_memory(rank, world, MEMORY_PLANS if task == "memory" else ALL_PLANS)
            if rank == 0:
                print_table(result)
        with open(f"{out}.{rank}", "w") as handle:
            json.dump(result, handle)
    finally:
        dist.destroy_process_group()


RECOMPUTE_MODEL = GPTConfig(layers=4, hidden=64, heads=2, seq=128, vocab=256)  # test_apply's


def recompute_table(micro_batch: int = 4) -> None:
    """One process: each recompute option applied, measured and predicted (a printed table)."""
    from shoal.perf.measure import measure_training_step

    print(f"{'recompute':<22} {'activations':>11} {'predicted':>11} {'error':>7} "
          f"{'peak':>11} {'predicted':>11} {'error':>7}")
    for name, selective in [("none", "auto"), ("selective", "core"), ("selective", "ops"),
                            ("full", "auto"), ("full(0.5)", "auto"), ("selective(0.5)", "core")]:
        plan = TrainingPlan.from_mapping({"recompute": name, "micro_batch": micro_batch})

        def build(plan: TrainingPlan = plan, selective: str = selective) -> torch.nn.Module:
            return apply_plan(ReferenceGPT(RECOMPUTE_MODEL), plan, selective=selective).model

        measured = measure_training_step(build, lambda b: random_batch(RECOMPUTE_MODEL, b),
                                         micro_batch, fake=False, count_flops=False)
        predicted = plan_memory(RECOMPUTE_MODEL, plan.to_parallel_config(FP32_ADAM))
        peak = measured.peak - measured.buffers
        label = f"{name} ({selective})" if name.startswith("selective") else name
        print(f"{label:<22} {measured.activations:>11,} {predicted.activations:>11,.0f} "
              f"{measured.activations / predicted.activations - 1:>+7.2%} {peak:>11,} "
              f"{predicted.peak:>11,.0f} {peak / predicted.peak - 1:>+7.2%}")


if __name__ == "__main__":
    if sys.argv[1:] == ["recompute"]:
        recompute_table()
    elif "RANK" in os.environ and len(sys.argv) == 3:
        run_rank(sys.argv[1], sys.argv[2])
    else:
        raise SystemExit("usage: python tests/perf_memory/apply_worker.py recompute\n"
                         "       torchrun --nproc_per_node=2 tests/perf_memory/apply_worker.py "
                         "memory|memory-all|trajectory OUT.json")
