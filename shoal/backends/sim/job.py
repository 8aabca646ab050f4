"""One simulated training job: advances by measured step times and gradient statistics.

The job behaves like a training script using shoal.train: it measures each configuration it
runs, fits its own throughput model from those measurements only, re-chooses its batch size at
every epoch boundary and reallocation, and reports what it learned to the scheduler.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from shoal.backends.sim.pause import RestartPause
from shoal.backends.sim.profile import ApplicationProfile, optimizer_step_time
from shoal.core.types import Allocation, JobLimits, ModelHints
from shoal.perf.efficiency import GradStats
from shoal.perf.goodput import GoodputModel
from shoal.perf.throughput import PerfParams, fit_perf_params, projected_params

_EPS = 1e-8


class SimJob(RestartPause):
    def __init__(
        self,
        name: str,
        app: ApplicationProfile,
        limits: JobLimits,
        submit_time: float,
        restart_delay: float,
        epochs: int | None = None,
        warm_start_fits: bool = True,
        start_delay: float | None = None,
        resize_overlap: float = 0.0,
        finish_delay: float = 0.0,
        time_resolution: float = 1.0,
    ):
        """``restart_delay``: seconds without progress after a resize; ``start_delay``: the
        same for a start from no devices (default ``restart_delay``); ``resize_overlap``:
        seconds the old allocation keeps training after a resize decision before that pause
        (a backend that pre-warms the new replicas, as the local one does); ``finish_delay``:
        seconds from the last step to the end of the job (its processes exiting);
        ``time_resolution``: epochs end on multiples of this many seconds, 1 as in the Pollux
        simulator whose traces have epochs of minutes; 0 for exact times (a replay of a real
        run, whose epochs may take milliseconds, would otherwise finish them in no time)."""
        self.name = name
        self.app = app
        self.limits = limits
        self.submit_time = submit_time
        self.restart_delay = restart_delay
        self.start_delay = restart_delay if start_delay is None else start_delay
        self.resize_overlap = resize_overlap
        self.finish_delay = finish_delay
        self.time_resolution = time_resolution
        self.overlap_left = 0.0
        self._overlap: tuple[Allocation, int, int] | None = None  # config still training
        self.max_epochs = epochs or app.max_epochs
        self.fixed_batch: int | None = limits.fixed_batch
        self.allocation: Allocation | None = None
        self.atomic_bsz = 0
        self.accum_steps = 0
        self.rescale_left = 0.0
        self.epoch = 0
        self.progress = 0.0
        self.device_seconds = 0.0
        self.finished_at: float | None = None
        # Measurements per device type: (nodes, replicas, micro-batch) -> (step, sync).
        self.measured: dict[str, dict[tuple[int, int, int], tuple[float, float]]] = {}
        self.perf: dict[str, PerfParams] = {}
        self._stale: set[str] = set()
        self.grad: GradStats | None = None
        self.warm_start_fits = warm_start_fits
        self.max_profiled: dict[str, int] = {}
        self.profiling_seconds = 0.0
        self._hints: ModelHints | None = None
        self._batch_memo: tuple | None = None

    # ----- model the job keeps about itself -----
    def _perf_params(self, device_type: str) -> PerfParams | None:
        if device_type in self._stale:
            table = self.measured[device_type]
            keys = np.array(list(table), dtype=float)
            vals = np.array(list(table.values()), dtype=float)
            self.perf[device_type] = fit_perf_params(
                keys[:, 0], keys[:, 1], keys[:, 2], vals[:, 0] - vals[:, 1], vals[:, 0],
                warm_start=self.perf.get(device_type) if self.warm_start_fits else None,
            )
            self._stale.discard(device_type)
        return self.perf.get(device_type)

    def bootstrap(self, device_types: list[str], seconds_per_type: float) -> None:
        """Profile one replica on each device type, as a new job does on a mixed cluster.

        Each type costs ``seconds_per_type`` device-seconds (start-up plus a few steps),
        counted in ``profiling_seconds``. Larger configurations of a type are then projected
        from the scaling the job observes on another type (see :meth:`goodput_model`).
        """
        if self.fixed_batch is not None:
            # A fixed-batch job is profiled at the micro-batch it will run: a model fitted at
            # another micro-batch mispredicts jobs whose batch is far from the initial one.
            bsz, _ = self._micro_batch(self.fixed_batch, 1)
        else:
            bsz = min(self.limits.init_batch_size, self.limits.max_local_bsz)
        for dtype in device_types:
            if dtype not in self.app.devices:
                continue
            step, sync = self.app.step_and_sync((1,), bsz, dtype)
            sqr, var = self.app.grad_stats(self.limits.init_batch_size, 0)
            self._record(dtype, 1, 1, bsz, step, sync, sqr, var)
            self.profiling_seconds += seconds_per_type

    def goodput_model(self, device_type: str) -> GoodputModel | None:
        # Scaling of a type seen only on one replica, borrowed from the best-explored type.
        perf = projected_params(device_type, self.max_profiled, self._perf_params,
                                lambda t: next(iter(self.measured[t]))[2])
        if perf is None or self.grad is None:
            return None
        lim = self.limits
        return GoodputModel(
            perf, self.grad, lim.init_batch_size, lim.max_batch_size,
            lim.min_local_bsz, lim.max_local_bsz,
        )

    def hints(self) -> ModelHints:
        if self._hints is None:
            models = {}
            for dtype in self.measured:
                model = self.goodput_model(dtype)
                if model is not None:
                    models[dtype] = model
            self._hints = ModelHints(models, dict(self.max_profiled), self.epoch, 0.0)
        return replace(self._hints, progress=self.fraction_done())

    def fraction_done(self) -> float:
        """Epochs done, counting the current one in part, over the job's epochs: what a real
        job reports from its position within the epoch (see the local backend)."""
        if self.epoch >= self.max_epochs:
            return 1.0
        start, end = self.app.progress_at(self.epoch), self.app.progress_at(self.epoch + 1)
        within = (self.progress - start) / (end - start) if end > start else 0.0
        return min((self.epoch + min(max(within, 0.0), 1.0)) / self.max_epochs, 1.0)

    def _record(self, dtype, nodes, replicas, bsz, step, sync, grad_sqr, grad_var) -> None:
        if self.grad is None or (self.grad.sqr, self.grad.var) != (grad_sqr, grad_var):
            self.grad = GradStats(grad_sqr, grad_var)
            self._hints = None
        table = self.measured.setdefault(dtype, {})
        if (nodes, replicas, bsz) not in table:
            table[(nodes, replicas, bsz)] = (step, sync)
            self.max_profiled[dtype] = max(self.max_profiled.get(dtype, 0), replicas)
            self._stale.add(dtype)
            self._hints = None

    # ----- batch size -----
    def _split(self, batch_size: float, replicas: int) -> tuple[int, int]:
        lim = self.limits
        local = math.ceil(batch_size / replicas - _EPS)
        accum = math.ceil(local / lim.max_local_bsz - _EPS) - 1
        if replicas == 1 and batch_size > lim.init_batch_size:
            accum = max(1, accum)
        return math.ceil(local / (accum + 1) - _EPS), accum

    def _micro_batch(self, batch_size: float, replicas: int) -> tuple[int, int]:
        """The (micro-batch, accumulation steps) that run ``batch_size`` on ``replicas``,
        capped so that one optimizer step stays within the job's largest batch."""
        atomic, accum = self._split(batch_size, replicas)
        return self._capped(atomic, accum, replicas), accum

    def _capped(self, atomic: int, accum: int, replicas: int) -> int:
        return min(atomic, int(self.limits.max_batch_size / (replicas * (accum + 1))))

    def choose_batch(self) -> None:
        alloc = self.allocation
        assert alloc is not None
        lim = self.limits
        replicas = alloc.num_replicas
        batch = self.fixed_batch
        model = None if batch is not None else self.goodput_model(alloc.device_type)
        if batch is None and model is None:
            batch = max(lim.init_batch_size, lim.min_local_bsz * replicas)
        if batch is not None:
            self.atomic_bsz, self.accum_steps = self._split(batch, replicas)
        else:
            # The choice only changes when the model or the allocation does.
            key = (model.perf, model.grad, len(alloc.placement), replicas)
            if self._batch_memo is None or self._batch_memo[0] != key:
                choice = model.optimize(len(alloc.placement), replicas)
                self._batch_memo = (key, int(choice.atomic_bsz), int(choice.accum_steps))
            self.atomic_bsz, self.accum_steps = self._batch_memo[1], self._batch_memo[2]
        self.atomic_bsz = self._capped(self.atomic_bsz, self.accum_steps, replicas)

    @property
    def batch_size(self) -> int:
        if self.allocation is None:
            return 0
        return self.allocation.num_replicas * self.atomic_bsz * (self.accum_steps + 1)

    # ----- control -----
    def reallocate(self, allocation: Allocation | None, fixed_batch: int | None) -> None:
        if fixed_batch is not None:
            self.fixed_batch = fixed_batch
        # What trains right now: a configuration still running during an overlap, else the
        # current one unless the job is paused in a restart.
        if self._overlap is not None:
            running: tuple[Allocation, int, int] | None = self._overlap
        elif self.allocation is not None and self.rescale_left <= 0:
            running = (self.allocation, self.atomic_bsz, self.accum_steps)
        else:
            running = None
        self.allocation = allocation
        self._overlap, self.overlap_left = None, 0.0
        if allocation is None:
            self.atomic_bsz = 0
            return
        self.choose_batch()
        if running is None:
            self.rescale_left = self.start_delay
            return
        self.rescale_left = self.restart_delay
        if self.resize_overlap > 0:
            self._overlap, self.overlap_left = running, self.resize_overlap

    # ----- time -----
    def advance(self, now: float, seconds: float) -> None:
        """Run for ``seconds`` starting at ``now`` (whole seconds, as a trace replays)."""
        alloc = self.allocation
        if alloc is None or self.finished_at is not None:
            return
        if self._overlap is not None:
            spent = self._advance_overlap(now, seconds)
            now += spent
            seconds -= spent
            if seconds <= 0 or self.finished_at is not None:
                return
        self._train(now, seconds)

    def _advance_overlap(self, now: float, seconds: float) -> float:
        """Train the previous configuration while the new one warms up; seconds used."""
        assert self._overlap is not None
        spend = min(self.overlap_left, seconds)
        current = (self.allocation, self.atomic_bsz, self.accum_steps, self.rescale_left)
        epoch = self.epoch
        self.allocation, self.atomic_bsz, self.accum_steps = self._overlap
        self.rescale_left = 0.0
        self._train(now, spend)
        self._overlap = (self.allocation, self.atomic_bsz, self.accum_steps)
        self.allocation, self.atomic_bsz, self.accum_steps, self.rescale_left = current
        self.overlap_left -= spend
        if self.overlap_left <= 0:
            self._overlap = None
        if self.epoch != epoch and self.finished_at is None:
            self._hints = None
            self.choose_batch()
        return spend

    def _train(self, now: float, seconds: float) -> None:
        alloc = self.allocation
        assert alloc is not None
        replicas = alloc.num_replicas
        delay = self.spend_pause(replicas, seconds)
        now += delay
        seconds -= delay
        app = self.app
        placement = alloc.placement
        nodes = len(placement)
        while seconds > 0 and self.finished_at is None:
            batch = self.batch_size
            step, sync = app.step_and_sync(placement, self.atomic_bsz, alloc.device_type)
            grad_sqr, grad_var = app.grad_stats(batch, self.epoch)
            scale = batch / self.limits.init_batch_size
            gain = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)
            self._record(alloc.device_type, nodes, replicas, self.atomic_bsz, step, sync,
                         grad_sqr, grad_var)
            step_time = optimizer_step_time(step, sync, self.accum_steps)
            rate = gain / step_time
            target = app.progress_at(self.epoch + 1)
            if self.progress + rate * seconds < target:
                self.progress += rate * seconds
                self.device_seconds += seconds * replicas
                seconds = 0
            else:
                self.epoch += 1
                self._hints = None
                used = float((target - self.progress) / rate)
                if self.time_resolution > 0:
                    used = round(used / self.time_resolution) * self.time_resolution
                if self.epoch > min(app.completion_epoch(batch), self.max_epochs - 1):
                    self.finished_at = now + used + self.finish_delay
                    self.device_seconds += self.finish_delay * replicas
                self.progress = target
                now += used
                self.device_seconds += used * replicas
                seconds -= used
            self.choose_batch()
