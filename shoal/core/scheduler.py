"""The scheduler core: every round, observe -> decide -> place -> act."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from shoal.core.demand import ServiceDemand, is_service
from shoal.core.placement import place
from shoal.core.state import Event, JobRecord
from shoal.core.types import (
    Allocation,
    Backend,
    Change,
    Decision,
    JobState,
    JobView,
    Policy,
)
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec

log = logging.getLogger(__name__)


# "interval": the periodic round; "arrival" / "completion": one run early because a job
# arrived / finished.
RoundTrigger = Literal["interval", "arrival", "completion"]


@dataclass
class RoundStats:
    time: float
    active_jobs: int
    allocated_devices: int
    decision_seconds: float
    changes: int
    trigger: RoundTrigger = "interval"


class Scheduler:
    """Owns job records; drives any :class:`Backend` with any :class:`Policy`."""

    def __init__(self, policy: Policy, backend: Backend):
        self.policy = policy
        self.backend = backend
        self.records: dict[str, JobRecord] = {}
        self.events: list[Event] = []
        self.rounds: list[RoundStats] = []
        self.demand = ServiceDemand()  # serve / stream jobs get their demand before training
        self.last_decision: Decision = {}  # the latest round's grants, for explanations

    # ----- admission -----
    def submit(self, spec: JobSpec) -> JobRecord:
        if spec.name in self.records:
            raise SpecError(f"a job named '{spec.name}' already exists", field="name")
        record = JobRecord(spec)
        self.records[spec.name] = record
        now = self.backend.now()
        self.events.append(Event(max(now, spec.submit_time), spec.name, "submitted"))
        try:
            record.limits = self.backend.admit(spec)  # type: ignore[attr-defined]
        except SpecError as exc:
            self._fail(record, now, f"rejected: {exc}")
            return record
        capacity = self.backend.cluster().capacity()
        if record.limits.max_replicas < 1 or (spec.rigid and spec.num_replicas > capacity):
            self._fail(record, now, f"needs {spec.num_replicas} devices, cluster has {capacity}")
        return record

    def cancel(self, name: str, reason: str = "cancelled by user") -> JobRecord:
        """End an active job now (it becomes failed with ``reason``); KeyError if unknown."""
        record = self.records[name]
        if record.active:
            self._fail(record, self.backend.now(), reason)
        return record

    def _fail(self, record: JobRecord, now: float, reason: str) -> None:
        record.failure = reason
        record.finish_time = now
        record.allocation = None
        record.transition(JobState.FAILED, now, self.events, reason)

    # ----- the round -----
    def unfinished(self) -> list[JobRecord]:
        return [r for r in self.records.values() if r.active]

    def active_views(self, now: float) -> list[JobView]:
        oracle_for = getattr(self.backend, "oracle", None)
        views = []
        for r in self.records.values():
            if not r.active or r.spec.submit_time > now or r.limits is None:
                continue
            views.append(
                JobView(
                    name=r.name,
                    spec=r.spec,
                    state=r.state,
                    submit_time=r.spec.submit_time,
                    age=now - r.spec.submit_time,
                    attained_service=r.device_seconds,
                    num_restarts=r.num_restarts,
                    allocation=r.allocation,
                    hints=r.hints,
                    limits=r.limits,
                    oracle=oracle_for(r.name) if oracle_for and not is_service(r.spec) else None,
                    restart_seconds=r.restart_seconds,
                )
            )
        return views

    def observe(self) -> None:
        now = self.backend.now()
        for status in self.backend.observe():
            record = self.records.get(status.name)
            if record is None or not record.active:
                continue
            record.device_seconds = status.device_seconds
            self.demand.observe(record.spec, status)
            record.profiling_seconds = float(status.extra.get("profiling_seconds", 0.0))
            if status.hints is not None:
                record.hints = status.hints
            if status.restart_seconds is not None:
                record.restart_seconds = status.restart_seconds
            if status.batch_size:
                record.batch_size = status.batch_size
            if status.failed_reason:
                self._fail(record, now, status.failed_reason)
            elif status.finished_at is not None:
                record.finish_time = status.finished_at
                record.allocation = None
                record.transition(JobState.FINISHED, status.finished_at, self.events)
            elif record.state == JobState.RESTARTING and status.extra.get("running", True):
                record.transition(JobState.RUNNING, now, self.events)

    def decide(self, views: list[JobView]) -> Decision:
        now = self.backend.now()
        services = self.demand.plan(views, self.backend.cluster(), now)
        decision = self.policy.decide(services.training, services.cluster, now) if (
            services.training and services.cluster.nodes) else {}
        known = {v.name for v in services.training}
        unknown = set(decision) - known
        if unknown:
            raise RuntimeError(f"policy {self.policy.name} granted unknown jobs {sorted(unknown)}")
        return {**services.grants, **decision}

    def act(self, decision: Decision, views: Iterable[JobView]) -> list[Change]:
        now = self.backend.now()
        current = self.demand.kept(views)
        placed = place(decision, self.backend.cluster(), current)
        changes: list[Change] = []
        for view in views:
            record = self.records[view.name]
            new = placed.get(view.name)
            if new == record.allocation:
                continue
            grant = decision.get(view.name)
            batch = grant.batch_size if grant else None
            changes.append(Change(view.name, new, batch))
            self._record_allocation(record, new, now)
        self.backend.apply(changes)
        return changes

    def _record_allocation(self, record: JobRecord, new: Allocation | None, now: float) -> None:
        record.allocation = new
        record.history.append((now, new))
        if new is None:
            record.transition(JobState.PENDING, now, self.events, "preempted")
            return
        if record.start_time is None:
            record.start_time = now
        record.num_starts += 1
        detail = f"{new.num_replicas}x{new.device_type} on nodes {sorted(set(new.nodes))}"
        record.transition(JobState.RESTARTING, now, self.events, detail)

    def round(self, trigger: RoundTrigger = "interval") -> RoundStats:
        self.observe()
        now = self.backend.now()
        views = self.active_views(now)
        started = time.perf_counter()
        decision = self.decide(views) if views else {}
        self.last_decision = decision
        elapsed = time.perf_counter() - started
        changes = self.act(decision, views) if views else []
        allocated = sum(
            r.allocation.num_replicas for r in self.records.values() if r.allocation is not None
        )
        stats = RoundStats(now, len(views), allocated, elapsed, len(changes), trigger)
        self.rounds.append(stats)
        return stats
