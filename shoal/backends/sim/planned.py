"""A simulated job that declares its model architecture instead of a measured profile.

The job trains ``target_tokens`` tokens (``target_tokens / seq`` samples) at its fixed global
batch. On every allocation it runs the plan the planner picks for that device type, device count
and spread over nodes (:mod:`shoal.perf.planned`), and advances at that plan's predicted
samples per second after the restart delay. The plan of every allocation is recorded
(``plan_history``). An allocation under which no plan fits the devices' memory fails the job
with an out-of-memory reason, as a real launch would; policies that read the job's goodput
models never choose one, because its goodput there is 0.

The job reports its models from submission on: the planner needs no measurement, so every
allowed device type has a model and the job may grow to the type's whole capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.backends.sim.pause import RestartPause
from shoal.core.planned_jobs import admit_model, allocation_shapes
from shoal.core.types import Allocation, JobLimits, JobStatus, ModelHints
from shoal.perf.models import GPTConfig
from shoal.perf.parallel import Plan, describe
from shoal.perf.planned import PlanMode, PlannedGoodput, plan_summary
from shoal.spec.cluster import ClusterSpec
from shoal.spec.job import JobSpec

# Step time charged for a device count no plan fits (used by oracle baselines only).
_INFEASIBLE_STEP_S = 1e9


class PlannedSimJob(RestartPause):
    """A model-declared training job in the simulator (same interface as ``SimJob``)."""

    def __init__(self, name: str, model: GPTConfig, model_text: str, global_batch: int,
                 target_tokens: int, models: Mapping[str, PlannedGoodput],
                 type_capacity: Mapping[str, int], limits: JobLimits, submit_time: float,
                 restart_delay: float):
        self.name = name
        self.model = model
        self.model_text = model_text
        self.global_batch = global_batch
        self.target_tokens = target_tokens
        self.total_samples = target_tokens / model.seq
        self.models = dict(models)
        self.type_capacity = dict(type_capacity)
        self.limits = limits
        self.submit_time = submit_time
        self.restart_delay = restart_delay
        self.allocation: Allocation | None = None
        self.plan: Plan | None = None
        self.samples = 0.0
        self.rescale_left = 0.0
        self.device_seconds = 0.0
        self.profiling_seconds = 0.0
        self.finished_at: float | None = None
        self.failed_reason: str | None = None
        self.plan_history: list[dict[str, Any]] = []

    # ----- what the job knows about itself -----
    @property
    def measured(self) -> dict[str, PlannedGoodput]:
        """Device types the job has a model for (all of them: the planner needs no runs)."""
        return self.models

    @property
    def progress(self) -> float:
        return min(self.samples / self.total_samples, 1.0)

    def hints(self) -> ModelHints:
        # PlannedGoodput answers what policies ask a GoodputModel (optimize, throughput).
        goodput: Mapping[str, Any] = self.models
        return ModelHints(goodput, dict(self.type_capacity), 0, self.progress)

    @property
    def batch_size(self) -> int:
        return self.global_batch if self.allocation is not None else 0

    def status(self) -> JobStatus:
        extra: dict[str, Any] = {"epoch": 0, "profiling_seconds": 0.0,
                                 "progress": self.progress}
        if self.plan is not None:
            extra["plan"] = describe(self.plan.config)
        return JobStatus(self.name, device_seconds=self.device_seconds,
                         finished_at=self.finished_at, failed_reason=self.failed_reason,
                         hints=self.hints(), batch_size=self.batch_size or None,
                         restart_seconds=self.restart_delay, extra=extra)

    def plan_for(self, allocation: Allocation) -> Plan | None:
        """The plan of ``allocation`` as placed (its smallest share of a node bounds the
        tensor-parallel and pipeline groups a node holds); None when none fits."""
        model = self.models.get(allocation.device_type)
        if model is None:
            return None
        return model.plan_on(allocation.per_node().values())

    # ----- control -----
    def reallocate(self, allocation: Allocation | None, fixed_batch: int | None = None,
                   now: float = 0.0) -> None:
        """Run on ``allocation`` (None stops the job). The global batch never changes."""
        self.allocation = allocation
        self.plan = None
        if allocation is None or self.failed_reason is not None:
            return
        self.plan = self.plan_for(allocation)
        entry: dict[str, Any] = {"time": now, "device_type": allocation.device_type,
                                 "replicas": allocation.num_replicas,
                                 "nodes": allocation.num_nodes,
                                 "plan": plan_summary(self.plan) if self.plan else None}
        self.plan_history.append(entry)
        if self.plan is None:
            if allocation.device_type not in self.models:
                self.failed_reason = (f"placed on {allocation.device_type}, not one of its "
                                      f"device types {sorted(self.models)}")
            else:
                self.failed_reason = (
                    f"out of memory: no plan of {self.model_text} fits "
                    f"{allocation.num_replicas} x {allocation.device_type} spread "
                    f"{'+'.join(map(str, allocation.per_node().values()))} over nodes")
            return
        self.rescale_left = self.restart_delay

    # ----- time -----
    def advance(self, now: float, seconds: float) -> None:
        alloc, plan = self.allocation, self.plan
        if alloc is None or plan is None or self.finished_at is not None or self.failed_reason:
            return
        replicas = alloc.num_replicas
        delay = self.spend_pause(replicas, seconds)
        now += delay
        seconds -= delay
        if seconds <= 0:
            return
        rate = plan.throughput
        left = self.total_samples - self.samples
        if rate * seconds < left:
            self.samples += rate * seconds
            self.device_seconds += seconds * replicas
            return
        used = left / rate
        self.samples = self.total_samples
        self.device_seconds += used * replicas
        self.finished_at = now + used

    # ----- baselines -----
    def best_on(self, device_type: str, max_devices: int) -> tuple[int, Plan] | None:
        """The fastest (devices, plan) of the allocation shapes with at most ``max_devices``."""
        model = self.models.get(device_type)
        if model is None:
            return None
        best: tuple[int, Plan] | None = None
        for count in allocation_shapes(model.node_capacity, self.type_capacity[device_type]
                                       // model.node_capacity):
            if count > max_devices:
                break
            plan = model.plan(-(-count // model.node_capacity), count)
            if plan is not None and (best is None or plan.throughput > best[1].throughput):
                best = (count, plan)
        return best

    def isolated_jct(self, devices: int, device_type: str) -> float | None:
        """Seconds alone on ``devices`` devices of ``device_type`` (the fastest fitting shape
        within them, else the smallest that fits), one restart delay included."""
        model = self.models.get(device_type)
        if model is None:
            return None
        best = self.best_on(device_type, devices)
        plan = best[1] if best else None
        if plan is None:
            shapes = allocation_shapes(model.node_capacity,
                                       self.type_capacity[device_type] // model.node_capacity)
            count = model.min_replicas(shapes)
            if count is None:
                return None
            plan = model.plan(-(-count // model.node_capacity), count)
        return None if plan is None else self.restart_delay + self.total_samples / plan.throughput


class PlannedOracle:
    """Ground truth of a model-declared job for oracle baselines (Optimus, Gavel's fallback)."""

    def __init__(self, job: PlannedSimJob):
        self._job = job

    def remaining_iterations(self, batch_size: int) -> float:
        job = self._job
        return max(job.total_samples - job.samples, 0.0) / job.global_batch

    def _plan(self, device_type: str, num_replicas: int) -> Plan | None:
        model = self._job.models.get(device_type)
        if model is None:
            return None
        return model.plan(-(-num_replicas // model.node_capacity), num_replicas)

    def step_time(self, num_replicas: int, batch_size: int) -> float:
        job = self._job
        dtype = job.allocation.device_type if job.allocation else next(iter(job.models))
        plan = self._plan(dtype, num_replicas)
        return plan.step_time_s if plan else _INFEASIBLE_STEP_S

    def throughput(self, device_type: str, num_replicas: int, batch_size: int) -> float:
        plan = self._plan(device_type, num_replicas)
        return plan.throughput if plan else 0.0


def admit_planned(spec: JobSpec, cluster: ClusterSpec, restart_delay: float,
                  mode: PlanMode = "search") -> PlannedSimJob:
    """A :class:`PlannedSimJob` for ``spec``; SpecError when no allocation on the cluster fits."""
    admitted = admit_model(spec, cluster, mode)
    assert spec.model is not None
    return PlannedSimJob(spec.name, admitted.model, spec.model, admitted.global_batch,
                         admitted.target_tokens, admitted.models, admitted.capacity,
                         admitted.limits, spec.submit_time, restart_delay)


def min_feasible_replicas(job: PlannedSimJob) -> dict[str, int]:
    """Per device type, the fewest devices (in the policies' shapes) under which a plan fits."""
    out = {}
    for dtype, model in job.models.items():
        shapes = allocation_shapes(model.node_capacity,
                                   job.type_capacity[dtype] // model.node_capacity)
        count = model.min_replicas(shapes)
        if count is not None:
            out[dtype] = count
    return out
