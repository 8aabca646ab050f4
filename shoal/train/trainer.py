"""The elastic data-parallel wrapper around a model and its optimizer.

Gradients are averaged exactly over the global batch whatever the world size: each micro-batch's
mean loss is scaled by its share of the global batch and a DDP communication hook *sums* the
buckets. The same hook reads each replica's local gradient norm before the all-reduce and the
global one after it, which is all the gradient-noise-scale estimate needs (no extra pass over
the model). Flags that must agree on every rank (checkpoint-and-exit, periodic checkpoint, a new
batch size) travel in one small all-reduce every ``control_every`` steps, issued asynchronously
and read at the next such step, so it never waits on the critical path. With several replicas
the noise is measured on those steps only (it costs two passes over the gradients).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shoal.perf.efficiency import GradStats
from shoal.train.batching import MicroBatch, StepPlan
from shoal.train.context import EXIT_CHECKPOINTED, current
from shoal.train.gns import NoiseScaleEstimator
from shoal.train.profile import StepProfile
from shoal.train.scaling import adascale_gain, lr_factor, resolve_rule
from shoal.train.signals import end_quickly_at_exit

log = logging.getLogger("shoal.train")

# Slots of the per-step control vector (summed over ranks).
_RESIZE, _CKPT_DUE, _NEW_BSZ, _PIECE_SQR, _PIECES = range(5)


def _sqr_norm(tensors: list[torch.Tensor]) -> float:
    if not tensors:
        return 0.0
    return float(sum(n.double() ** 2 for n in torch._foreach_norm(tensors)))


class ElasticTrainer:
    """Wrap ``model`` and ``optimizer``; call ``backward(loss)`` and ``step()`` per micro-batch.

    ``lr_scaling``: ``auto`` (AdaScale for SGD, square-root for Adam/AdamW), ``adascale``,
    ``sqrt``, ``linear`` or ``none``. The loss passed to ``backward`` must be the mean over the
    micro-batch (PyTorch's default reduction).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        lr_scheduler: Any | None = None,
        lr_scaling: str = "auto",
        find_unused_parameters: bool = False,
        measure_noise: bool = True,
        noise_smoothing: float = 0.9,
        control_every: int = 4,
    ) -> None:
        ctx = current()
        if control_every < 1:
            raise ValueError(f"control_every={control_every} must be at least 1")
        self.control_every = control_every
        self._ctx = ctx
        self.module = model.to(ctx.device)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.rule = resolve_rule(lr_scaling, optimizer)
        self.measure_noise = measure_noise
        self.noise = NoiseScaleEstimator(noise_smoothing)
        self.profile = StepProfile(device_type=ctx.env.device_type)
        self.steps = 0
        self.samples = 0
        self.progress = 0.0  # samples-equivalent at the initial batch size (scale-invariant)
        self.last_lr_factor = 1.0
        # Per finished epoch: progress, samples, steps, gradient statistics and wall time, the
        # trace a simulator replays (see shoal.service.replay).
        self.epoch_trace: list[dict[str, Any]] = []
        store = ctx.checkpoint
        store.register("model", self.module)
        store.register("optimizer", optimizer)
        if lr_scheduler is not None:
            store.register("lr_scheduler", lr_scheduler)
        store.register("trainer", self)

        self._ddp: DistributedDataParallel | None = None
        self._loss_scale = 1.0
        if ctx.env.distributed:
            self._ddp = DistributedDataParallel(
                self.module,
                device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                find_unused_parameters=find_unused_parameters,
            )
            # DDP inspects the hook's annotations and rejects the string ones this module's
            # ``from __future__ import annotations`` produces, so register an unannotated shim.
            def comm_hook(state, bucket):  # type: ignore[no-untyped-def]
                return self._comm_hook(bucket)

            if measure_noise:
                self._ddp.register_comm_hook(None, comm_hook)
            else:
                # DDP's built-in C++ hook averages over ranks; scaling the loss by the world
                # size turns that average back into the exact sum the weights expect.
                self._loss_scale = float(ctx.world_size)
        self.model: nn.Module = self._ddp if self._ddp is not None else self.module
        self._params = [p for p in self.module.parameters() if p.requires_grad]

        self._plan: StepPlan | None = None
        self._micro: MicroBatch | None = None
        self._measure = False
        self._step_start = 0.0
        self._sync_start: float | None = None
        self._sync_end: float | None = None
        self._local_parts: list[torch.Tensor] = []
        self._total_parts: list[torch.Tensor] = []
        self._pieces_sqr = 0.0
        self._pieces_inv = 0.0
        self._pieces = 0
        self._previous_grads: list[torch.Tensor] | None = None
        self._pending: tuple[Any, torch.Tensor, float, float, int] | None = None
        self._last_checkpoint = (time.monotonic(), self.steps)
        self._last_report = 0.0
        self._last_report_epoch = -1
        self._started = time.monotonic()
        ctx.trainer = self

    # -- called by the data loader ----------------------------------------------------------
    def begin_micro_batch(self, plan: StepPlan, micro: MicroBatch, first: bool) -> None:
        if first:
            self._step_start = time.perf_counter()
            # Released here rather than right after the optimizer step, as in the textbook loop:
            # the memory allocator then sees the same pattern (free, forward, backward).
            self.optimizer.zero_grad(set_to_none=True)
            self._sync_start = self._sync_end = None
            self._local_parts, self._total_parts = [], []
            self._pieces_sqr, self._pieces_inv, self._pieces = 0.0, 0.0, 0
            self._previous_grads = None
            if self._ctx.world_size > 1:
                self._measure = self.measure_noise and self._control_step
            else:
                self._measure = self.measure_noise and plan.micro_steps > 1
        if self._ddp is not None:
            self._ddp.require_backward_grad_sync = micro.sync
        self._plan, self._micro = plan, micro

    # -- the user's loop --------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` (the micro-batch mean) weighted by its share of the batch."""
        micro, plan = self._micro, self._plan
        if micro is None or plan is None:
            raise RuntimeError("backward() needs a batch from a shoal.train.ElasticDataLoader")
        (loss * (micro.weight * self._loss_scale)).backward()
        if micro.sync and self._ddp is not None:
            self._sync_end = time.perf_counter()
        if self._measure and self._ddp is None and micro.size > 0:
            self._record_micro_piece(micro.size, plan.batch_size, last=micro.sync)

    def step(self) -> bool:
        """Apply the optimizer at the end of a global batch; False on accumulation micro-steps.

        At the step boundary this also settles checkpoint and resize requests; after a
        requested checkpoint every rank exits with ``EXIT_CHECKPOINTED``.
        """
        micro, plan = self._micro, self._plan
        if micro is None or plan is None:
            raise RuntimeError("step() needs a batch from a shoal.train.ElasticDataLoader")
        if not micro.sync:
            return False
        scale = plan.batch_size / plan.init_batch_size
        factor = lr_factor(self.rule, scale, self.grad_stats)
        self.last_lr_factor = factor
        if factor != 1.0:
            original = [group["lr"] for group in self.optimizer.param_groups]
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * factor
            self.optimizer.step()
            for group, lr in zip(self.optimizer.param_groups, original, strict=True):
                group["lr"] = lr
        else:
            self.optimizer.step()

        self.steps += 1
        self.samples += plan.batch_size
        self.progress += adascale_gain(self.grad_stats, scale) * plan.init_batch_size
        step_time = time.perf_counter() - self._step_start
        sync_time = 0.0
        if self._sync_start is not None and self._sync_end is not None:
            sync_time = max(0.0, self._sync_end - self._sync_start)
        ctx = self._ctx
        self.profile.record(
            (ctx.env.num_nodes, ctx.world_size, plan.local_bsz, plan.accum_steps),
            step_time,
            sync_time,
        )
        self._micro = None
        self._boundary(plan)
        if ctx.env.probe_steps is not None and self.steps >= ctx.env.probe_steps:
            self._end_probe()
        return True

    def epoch_done(self, epoch: int) -> None:
        """Record the end of ``epoch`` (called by ``shoal.train.epochs``)."""
        stats = self.grad_stats
        self.epoch_trace.append({
            "epoch": epoch,
            "progress": self.progress,
            "samples": self.samples,
            "steps": self.steps,
            "grad_sqr": stats.sqr if stats else None,
            "grad_var": stats.var if stats else None,
            "time": time.time(),
        })

    @property
    def _control_step(self) -> bool:
        """Whether the step being taken exchanges control flags (the same on every rank)."""
        return self.steps % self.control_every == 0

    # -- statistics -------------------------------------------------------------------------
    @property
    def grad_stats(self) -> GradStats | None:
        """Smoothed (|G|^2, tr(Sigma)/M0) at the initial batch size, None until measured."""
        loader = self._ctx.loader
        init = loader.init_batch_size if loader is not None else None
        if init is None and self._plan is not None:
            init = self._plan.init_batch_size
        return None if init is None else self.noise.stats(init)

    def _comm_hook(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if self._sync_start is None:
            self._sync_start = time.perf_counter()
        buffer = bucket.buffer()
        measure = self._measure
        if measure:
            self._local_parts.append(torch.linalg.vector_norm(buffer))
        future = dist.all_reduce(buffer, async_op=True).get_future()  # type: ignore[union-attr]

        def reduced(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            out = fut.value()[0]
            if measure:
                self._total_parts.append(torch.linalg.vector_norm(out))
            return out

        return future.then(reduced)

    def _record_micro_piece(self, size: int, batch_size: int, last: bool) -> None:
        """One replica: the gradient of one micro-step is the growth of the accumulated one."""
        grads = [p.grad for p in self._params if p.grad is not None]
        if self._previous_grads is None:
            piece = _sqr_norm(grads)
        else:
            piece = _sqr_norm(torch._foreach_sub(grads, self._previous_grads))
        self._previous_grads = None if last else [g.detach().clone() for g in grads]
        self._pieces_sqr += piece * (batch_size / size) ** 2
        self._pieces_inv += 1.0 / size
        self._pieces += 1
        if last and self._pieces >= 2:
            self.noise.update(
                self._pieces_sqr / self._pieces,
                self._pieces_inv / self._pieces,
                _sqr_norm(grads),
                batch_size,
            )

    # -- step boundary: agreement, checkpoints, reports -------------------------------------
    def _boundary(self, plan: StepPlan) -> None:
        ctx = self._ctx
        now = time.monotonic()
        if ctx.world_size > 1 and (self.steps - 1) % self.control_every != 0:
            # Not a control step: requests wait for the next one (they stay pending).
            self._maybe_report(now)
            return
        resize = ctx.resize.requested()
        due = self._checkpoint_due(now) if ctx.rank == 0 else False
        if due:
            # The save happens at the next boundary (or now with one rank); do not ask twice.
            self._last_checkpoint = (now, self.steps)
        new_bsz = 0
        if ctx.rank == 0 and ctx.reporter.requested_batch_size is not None:
            new_bsz, ctx.reporter.requested_batch_size = ctx.reporter.requested_batch_size, None
        if ctx.world_size == 1:
            self._act(resize, due, new_bsz)
            self._maybe_report(now)
            return
        local_sqr, pieces = 0.0, 0.0
        share = plan.shares[ctx.rank]
        if self._measure and share > 0 and self._local_parts:
            local_sqr = sum(float(p) ** 2 for p in self._local_parts)
            local_sqr *= (plan.batch_size / share) ** 2
            pieces = 1.0
        control = torch.tensor(
            [float(resize), float(due), float(new_bsz), local_sqr, pieces],
            dtype=torch.float64,
            device=ctx.device,
        )
        previous = self._settle_pending()
        if self._measure and self._total_parts:
            total_sqr = sum(float(p) ** 2 for p in self._total_parts)
            nonempty = [s for s in plan.shares if s > 0]
            inv_mean = sum(1.0 / s for s in nonempty) / len(nonempty)
        else:
            total_sqr, inv_mean = 0.0, 0.0
        work = dist.all_reduce(control, async_op=True)
        self._pending = (work, control, total_sqr, inv_mean, plan.batch_size)
        if previous is not None:
            self._act(previous[_RESIZE] > 0, previous[_CKPT_DUE] > 0, int(previous[_NEW_BSZ]))
        self._maybe_report(now)

    def _settle_pending(self) -> list[float] | None:
        """Wait for last step's control all-reduce and fold its noise measurement in."""
        if self._pending is None:
            return None
        work, control, total_sqr, inv_mean, batch_size = self._pending
        self._pending = None
        work.wait()
        values = control.tolist()
        if values[_PIECES] >= 2 and inv_mean > 0:
            self.noise.update(
                values[_PIECE_SQR] / values[_PIECES], inv_mean, total_sqr, batch_size
            )
        return values

    def _checkpoint_due(self, now: float) -> bool:
        ctx = self._ctx
        if not ctx.checkpoint.enabled:
            return False
        since_time, since_steps = self._last_checkpoint
        by_time = ctx.checkpoint_interval_s is not None and (
            now - since_time >= ctx.checkpoint_interval_s
        )
        by_steps = ctx.checkpoint_interval_steps is not None and (
            self.steps - since_steps >= ctx.checkpoint_interval_steps
        )
        return by_time or by_steps

    def _act(self, resize: bool, due: bool, new_bsz: int) -> None:
        ctx = self._ctx
        if resize and ctx.checkpoint.enabled:
            self._checkpoint_and_exit()
        if due:
            self.save_checkpoint()
        if new_bsz > 0 and ctx.loader is not None:
            ctx.loader.set_batch_size(new_bsz)

    def save_checkpoint(self) -> None:
        ctx = self._ctx
        ctx.checkpoint.save(
            {"step": self.steps, "epoch": ctx.epochs.epoch, "world_size": ctx.world_size}
        )
        self._last_checkpoint = (time.monotonic(), self.steps)

    def _checkpoint_and_exit(self) -> None:
        ctx = self._ctx
        self.save_checkpoint()
        if ctx.rank == 0:
            ctx.resize.clear_file()
            log.info("shoal: checkpointed at step %d; exiting for a resize", self.steps)
        self._send_report(checkpointed=True)
        ctx.reporter.close()
        if ctx.world_size > 1:
            self._settle_pending()
            dist.barrier()
            dist.destroy_process_group()
        end_quickly_at_exit(EXIT_CHECKPOINTED)
        sys.exit(EXIT_CHECKPOINTED)

    def _end_probe(self) -> None:
        """A probe has measured its steps: report them and end (nothing is checkpointed)."""
        ctx = self._ctx
        print(f"shoal: probe of {self.steps} steps done; exiting", flush=True)  # in its log
        self._send_report()
        ctx.reporter.close()
        end_quickly_at_exit(0)
        sys.exit(0)

    def _maybe_report(self, now: float) -> None:
        ctx = self._ctx
        if not ctx.reporter.enabled:
            return
        epoch = ctx.epochs.epoch
        if now - self._last_report >= ctx.report_interval_s or epoch != self._last_report_epoch:
            self._last_report = now
            self._last_report_epoch = epoch
            self._send_report()

    def report(self, **extra: Any) -> dict[str, Any]:
        """The payload sent to the scheduler (see docs/training.md)."""
        ctx = self._ctx
        loader = ctx.loader
        stats = self.grad_stats
        elapsed = max(time.monotonic() - self._started, 1e-9)
        plan = self._plan
        payload: dict[str, Any] = {
            "job": ctx.env.job,
            "time": time.time(),
            "epoch": ctx.epochs.epoch,
            "steps": self.steps,
            "samples": self.samples,
            "progress": self.progress,
            "samples_per_second": self._recent_throughput(elapsed),
            "num_nodes": ctx.env.num_nodes,
            "num_replicas": ctx.world_size,
            "local_bsz": plan.local_bsz if plan else None,
            "accum_steps": plan.accum_steps if plan else None,
            "grad_sqr": stats.sqr if stats else None,
            "grad_var": stats.var if stats else None,
            "lr_factor": self.last_lr_factor,
            "profile": self.profile.rows(),
            "epochs": self.epoch_trace,
        }
        if loader is not None:
            payload.update(
                batch_size=loader.batch_size,
                init_batch_size=loader.init_batch_size,
                max_batch_size=loader.max_batch_size,
                max_local_bsz=loader.max_local_bsz,
                epoch_position=loader.position,
                epoch_samples=loader.num_samples,
            )
        if ctx.env.probe_steps is not None:
            payload["probe"] = True  # measurements only: not the job's progress
        payload.update(extra)
        return payload

    def _recent_throughput(self, elapsed: float) -> float:
        ctx = self._ctx
        plan = self._plan
        if plan is not None:
            key = (ctx.env.num_nodes, ctx.world_size, plan.local_bsz, plan.accum_steps)
            mean = self.profile.mean(key)
            if mean is not None and mean[0] > 0:
                return plan.target_batch_size / mean[0]
        return self._session_samples / elapsed if elapsed > 0 else 0.0

    @property
    def _session_samples(self) -> int:
        return self.samples - self._restored_samples

    def _send_report(self, **extra: Any) -> None:
        if self._ctx.reporter.enabled:
            self._ctx.reporter.submit(self.report(**extra))

    def finish(self) -> None:
        """End of training: settle the last control all-reduce and send a final report."""
        if self._ctx.world_size > 1:
            self._settle_pending()
        self.optimizer.zero_grad(set_to_none=True)
        self._send_report(done=True)

    def describe(self) -> str:
        """One line for logs: replicas, batch size, LR factor, gradient noise scale."""
        ctx = self._ctx
        stats = self.grad_stats
        batch = ctx.loader.batch_size if ctx.loader is not None else None
        init = ctx.loader.init_batch_size if ctx.loader is not None else 1
        noise = "-"
        if stats is not None:
            phi = stats.noise_scale(init)
            noise = f"{phi:.0f}" if phi < 1e9 else "inf"
        return (
            f"replicas={ctx.world_size} batch={batch} lr_factor={self.last_lr_factor:.2f} "
            f"noise_scale={noise} step={self.steps} "
            f"elapsed={time.monotonic() - self._started:.1f}s"
        )

    # -- checkpoint -------------------------------------------------------------------------
    _restored_samples = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "samples": self.samples,
            "progress": self.progress,
            "noise": self.noise.state_dict(),
            "profile": self.profile.state_dict(),
            "epochs": self.epoch_trace,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.samples = int(state["samples"])
        self._restored_samples = self.samples
        self.progress = float(state["progress"])
        self.noise.load_state_dict(state["noise"])
        self.profile.load_state_dict(state["profile"])
        self.epoch_trace = list(state.get("epochs", []))
