"""Training under the parallel plan shoal chose for the job's allocation, elastic across plans.

    import shoal.train as st
    st.init()
    trainer = st.PlannedTrainer(model, torch.optim.AdamW, global_batch=64, lr=3e-4)
    while trainer.steps < total_steps:
        batch = next_global_batch(trainer.steps)        # the same on every rank
        loss = trainer.step(trainer.local_share(batch))
    st.shutdown()

The plan comes from ``SHOAL_PLAN`` (the backend sets it to the plan of the allocation the job
runs on), else from ``plan=`` or plain data parallelism over the ranks. The trainer applies it
(:func:`shoal.train.apply_plan`), builds the plan's optimizer, and at step boundaries does what
``ElasticTrainer`` does for a data-parallel job: it checkpoints every
``SHOAL_CHECKPOINT_INTERVAL`` seconds, and on a resize request (SIGTERM or the request file) it
checkpoints and exits with ``EXIT_CHECKPOINTED``. Each rank writes its own part of the model and
optimizer state (:meth:`AppliedPlan.save_sharded`, ``torch.distributed.checkpoint``), and the
next run reshards it to whatever plan and world size its allocation has, so no process ever
holds more than its own part. The global batch is fixed: a planned job's plan is chosen
for it, so the scheduler does not change it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shoal.spec.errors import SpecError
from shoal.train.apply import AppliedPlan, Batch, ForwardFn, TrainingPlan, apply_plan, get_plan
from shoal.train.checkpoint import Stateful
from shoal.train.context import EXIT_CHECKPOINTED, current
from shoal.train.signals import end_quickly_at_exit

log = logging.getLogger("shoal.train")

SHARDS_PREFIX = "plan-"


class PlannedTrainer:
    """Apply the job's parallel plan to ``model`` and train it one global batch per ``step``.

    ``global_batch``: samples per optimizer step over all ranks; a plan must match it.
    ``micro_batch``: the micro-batch of the plan used outside shoal (default: each rank's whole
    share at once). ``plan``: that plan given explicitly instead (any form ``apply_plan``
    takes). ``apply_options``: keyword arguments for :func:`apply_plan` (``layers``,
    ``attention_core``, ...). ``control_every``: steps between the ranks' agreement on
    checkpoint and resize requests. Other keyword arguments go to ``optimizer_class``.
    """

    def __init__(self, model: nn.Module,
                 optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW, *,
                 global_batch: int, micro_batch: int | None = None, plan: Any = None,
                 forward: ForwardFn | None = None, apply_options: Mapping[str, Any] | None = None,
                 control_every: int = 4, **optimizer_kwargs: Any) -> None:
        ctx = current()
        if control_every < 1:
            raise ValueError(f"control_every={control_every} must be at least 1")
        if ctx.trainer is not None:
            raise RuntimeError("a job has one trainer; this process already made one")
        self._ctx = ctx
        self.global_batch = global_batch
        self.plan = get_plan(plan if plan is not None else
                             _data_parallel(global_batch, ctx.world_size, micro_batch))
        assert self.plan is not None
        if self.plan.dp != ctx.world_size:
            raise SpecError(f"the plan has dp={self.plan.dp} but {ctx.world_size} ranks run; "
                            "the job's plan must be made for its allocation", field="dp")
        if self.plan.global_batch != global_batch:
            raise SpecError(f"the plan's global batch is {self.plan.global_batch} (dp "
                            f"{self.plan.dp} x micro_batch {self.plan.micro_batch} x "
                            f"accumulation {self.plan.accumulation}), the script's "
                            f"{global_batch}; use the job's batch_size in both", field="batch_size")
        self.applied: AppliedPlan = apply_plan(model.to(ctx.device), self.plan,
                                               **dict(apply_options or {}))
        self.optimizer = self.applied.optimizer(optimizer_class, **optimizer_kwargs)
        self.forward = forward
        self.control_every = control_every
        self.steps = 0
        self.samples = 0
        self.runs: list[dict[str, Any]] = []
        self._shards: str | None = None  # the folder of the last checkpoint's model state
        store = ctx.checkpoint
        if store.register("planned_trainer", self) and self._shards is not None:
            assert store.directory is not None
            self.applied.load_sharded(self.optimizer, store.directory / self._shards)
            if ctx.rank == 0:
                log.info("shoal: resumed at step %d under %s", self.steps, self.applied.sharding)
        if ctx.rank == 0 and store.directory is not None:
            self._remove_shards(store.directory, keep=self._shards)  # a crash's leftovers
        self.runs.append({"world_size": ctx.world_size, "plan": dataclasses.asdict(self.plan),
                          "sharding": self.applied.sharding, "first_step": self.steps + 1})
        self._last_checkpoint = time.monotonic()
        self._last_report = 0.0
        self._started = time.monotonic()
        self._session_start_samples = self.samples
        self._settled = self.steps
        ctx.trainer = self

    def register(self, name: str, obj: Stateful) -> bool:
        """Keep ``obj``'s ``state_dict()`` in the job's checkpoint (rank 0 writes it) and
        restore it now if the checkpoint holds it; True when restored."""
        return self._ctx.checkpoint.register(name, obj)

    @property
    def model(self) -> nn.Module:
        """The module to call: the FSDP-sharded model, a DDP wrapper or the model itself."""
        return self.applied.model

    def local_share(self, global_batch: Batch) -> Batch:
        """This rank's share of a global batch (every rank passes the same global batch)."""
        return self.applied.local_share(global_batch)

    def step(self, local_batch: Batch) -> float:
        """One optimizer step on this rank's share; returns the global batch's mean loss.

        Checkpoint and resize requests are settled when the *next* step starts, so what the
        script did with this step's result (its loss, say) is in a checkpoint taken then;
        after a requested checkpoint every rank exits with ``EXIT_CHECKPOINTED``.
        """
        if self.steps > self._settled:
            self._boundary()
            self._settled = self.steps
        loss = float(self.applied.step(local_batch, self.optimizer, self.forward))
        self.steps += 1
        self.samples += self.global_batch
        now = time.monotonic()
        if self._ctx.reporter.enabled and now - self._last_report >= self._ctx.report_interval_s:
            self._last_report = now
            self._ctx.reporter.submit(self.report())
        return loss

    # ----- step boundary -----
    def _boundary(self) -> None:
        ctx = self._ctx
        now = time.monotonic()
        if self.steps % self.control_every == 0 or ctx.world_size == 1:
            resize = ctx.resize.requested()
            due = ctx.rank == 0 and self._checkpoint_due(now)
            if ctx.world_size > 1:
                # Two flags every few steps; the gradient all-reduce of a step dwarfs it.
                flags = torch.tensor([float(resize), float(due)], device=ctx.device)
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
                resize, due = bool(flags[0]), bool(flags[1])
            if resize and ctx.checkpoint.enabled:
                self._checkpoint_and_exit()
            if due:
                self.save_checkpoint()

    def _checkpoint_due(self, now: float) -> bool:
        ctx = self._ctx
        return (ctx.checkpoint.enabled and ctx.checkpoint_interval_s is not None
                and now - self._last_checkpoint >= ctx.checkpoint_interval_s)

    def save_checkpoint(self) -> None:
        """Write the model and optimizer state, each rank its own part, then the job's
        checkpoint file naming it (every rank must call this).

        The parts go to a fresh folder, renamed to ``plan-<step>`` once complete; only then
        does ``state.pt`` (written by rename too) point at it, and older folders are removed.
        A crash at any moment leaves ``state.pt`` naming a complete folder."""
        ctx = self._ctx
        directory = ctx.checkpoint.directory
        if directory is None:
            return
        name = f"{SHARDS_PREFIX}{self.steps:09d}"
        partial = directory / f"{name}.partial"
        if ctx.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        if ctx.world_size > 1:
            dist.barrier()  # no rank writes into a folder rank 0 is still clearing
        # Returns on rank 0 once every rank's part is written (it writes the metadata last).
        self.applied.save_sharded(self.optimizer, partial)
        if ctx.rank == 0:
            shutil.rmtree(directory / name, ignore_errors=True)
            os.replace(partial, directory / name)
        self._shards = name
        ctx.checkpoint.save({"step": self.steps, "epoch": ctx.epochs.epoch,
                             "world_size": ctx.world_size})
        if ctx.rank == 0:
            self._remove_shards(directory, keep=name)
        self._last_checkpoint = time.monotonic()

    @staticmethod
    def _remove_shards(directory: Path, keep: str | None) -> None:
        """Delete the state folders ``state.pt`` does not name (older or incomplete ones)."""
        for folder in directory.glob(f"{SHARDS_PREFIX}*"):
            if folder.name != keep and folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)

    def _checkpoint_and_exit(self) -> None:
        ctx = self._ctx
        self.save_checkpoint()
        if ctx.rank == 0:
            ctx.resize.clear_file()
            log.info("shoal: checkpointed at step %d; exiting for a resize", self.steps)
        if ctx.reporter.enabled:
            ctx.reporter.submit(self.report(checkpointed=True))
        ctx.reporter.close()
        if ctx.world_size > 1:
            dist.barrier()
            dist.destroy_process_group()
        end_quickly_at_exit(EXIT_CHECKPOINTED)
        sys.exit(EXIT_CHECKPOINTED)

    # ----- reports -----
    def report(self, **extra: Any) -> dict[str, Any]:
        """The payload sent to the scheduler: steps and samples are the job's progress."""
        ctx = self._ctx
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return {"job": ctx.env.job, "time": time.time(), "epoch": ctx.epochs.epoch,
                "steps": self.steps, "samples": self.samples, "batch_size": self.global_batch,
                "num_replicas": ctx.world_size,
                "samples_per_second": (self.samples - self._session_start_samples) / elapsed,
                "plan": dataclasses.asdict(self.plan), "sharding": self.applied.sharding,
                **extra}

    def finish(self) -> None:
        """End of training (called by ``shoal.train.shutdown`` / ``epochs``): final report."""
        if self._ctx.reporter.enabled:
            self._ctx.reporter.submit(self.report(done=True))

    def epoch_done(self, epoch: int) -> None:
        """``shoal.train.epochs`` counts the epochs; a planned job has nothing to add."""

    def begin_micro_batch(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("ElasticDataLoader picks the batch size, but a planned job's global "
                           "batch is fixed by its plan: give PlannedTrainer.local_share the "
                           "global batch instead")

    def describe(self) -> str:
        return (f"replicas={self._ctx.world_size} sharding={self.applied.sharding} "
                f"micro_batch={self.plan.micro_batch} accumulation={self.plan.accumulation} "
                f"step={self.steps}")

    # ----- checkpoint of the counters -----
    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "samples": self.samples, "runs": self.runs,
                "shards": self._shards}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.samples = int(state["samples"])
        self.runs = list(state.get("runs", []))
        self._shards = state.get("shards")


def _data_parallel(global_batch: int, world: int, micro_batch: int | None) -> TrainingPlan:
    if global_batch % world:
        raise SpecError(f"a global batch of {global_batch} does not split over {world} ranks; "
                        "use a multiple of the world size", field="batch_size")
    local = global_batch // world
    micro = micro_batch or local
    if micro < 1 or local % micro:
        raise SpecError(f"micro_batch {micro} does not divide each rank's {local} samples",
                        field="micro_batch")
    return TrainingPlan(dp=world, micro_batch=micro, accumulation=local // micro)
