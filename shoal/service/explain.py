"""Why each job holds what it holds: the scheduler's latest grant per job, in words.

After every round the service compares each active job's grant (device count, type, batch
size) and placement with the one it explained last; when it changed, it records a structured
decision and appends a ``decision`` event whose detail is the sentence, so the reason is in
the event log (and the store) next to the state changes it caused.
"""

from __future__ import annotations

import logging
from typing import Any

from shoal.core.scheduler import Scheduler
from shoal.core.state import Event, JobRecord
from shoal.core.types import Allocation, Grant

log = logging.getLogger(__name__)

Key = tuple[int, str | None, int | None, tuple[int, ...] | None]


def _nodes(alloc: Allocation | None) -> list[int]:
    return [] if alloc is None else sorted(set(alloc.nodes))


def _goodput(record: JobRecord, device_type: str, alloc: Allocation) -> tuple[float, float]:
    """Predicted goodput of ``record`` on ``alloc`` and its speedup over one device;
    (nan, nan) when the job has not reported enough for a model yet."""
    model = record.hints.goodput.get(device_type)
    if model is None:
        return float("nan"), float("nan")
    here = float(model.optimize(alloc.num_nodes, alloc.num_replicas).goodput)
    one = float(model.optimize(1, 1).goodput)
    return here, (here / one if one > 0 else float("nan"))


class DecisionLog:
    """The latest explained decision of every job (in memory; the events persist)."""

    def __init__(self) -> None:
        self.latest: dict[str, dict[str, Any]] = {}
        self._keys: dict[str, Key] = {}

    def note(self, scheduler: Scheduler, now: float) -> list[Event]:
        """Explain what changed in the round that just ran; the events are also appended to
        ``scheduler.events``."""
        decision = scheduler.last_decision
        considered = [r for r in scheduler.records.values()
                      if r.active and r.limits is not None and r.spec.submit_time <= now]
        capacity = scheduler.backend.cluster().capacity()
        used = sum(r.allocation.num_replicas for r in considered if r.allocation is not None)
        events = []
        for record in considered:
            grant = decision.get(record.name)
            alloc = record.allocation
            key: Key = (
                0 if grant is None else grant.replicas,
                alloc.device_type if alloc is not None else None,
                None if grant is None else grant.batch_size,
                None if alloc is None else alloc.nodes,
            )
            if self._keys.get(record.name) == key:
                continue
            self._keys[record.name] = key
            entry = self._explain(scheduler.policy.name, record, grant, scheduler, now,
                                  len(considered), used, capacity)
            self.latest[record.name] = entry
            events.append(Event(now, record.name, "decision", entry["reason"]))
        scheduler.events.extend(events)
        return events

    def _explain(self, policy: str, record: JobRecord, grant: Grant | None,
                 scheduler: Scheduler, now: float, competing: int, used: int,
                 capacity: int) -> dict[str, Any]:
        alloc = record.allocation
        entry: dict[str, Any] = {
            "time": now,
            "round": len(scheduler.rounds),
            "policy": policy,
            "replicas": 0 if alloc is None else alloc.num_replicas,
            "device_type": None if alloc is None else alloc.device_type,
            "nodes": _nodes(alloc),
            "batch_size": None if grant is None else grant.batch_size,
            "competing_jobs": competing,
            "devices_in_use": used,
            "capacity": capacity,
            "predicted_goodput": None,
            "speedup": None,
        }
        context = f"{competing} active job(s) share {capacity} device(s), {used} in use"
        if alloc is None:
            entry["reason"] = f"{policy} gave no devices this round ({context})"
            return entry
        placed = f"{alloc.num_replicas} x {alloc.device_type} on node(s) {_nodes(alloc)}"
        parts = [f"{policy} granted {placed}"]
        if grant is not None and grant.batch_size:
            parts.append(f"global batch {grant.batch_size}")
        try:
            goodput, speedup = _goodput(record, alloc.device_type, alloc)
        except Exception:  # an explanation never stops the service
            log.exception("predicting goodput of %s", record.name)
            goodput, speedup = float("nan"), float("nan")
        if goodput == goodput:  # not nan
            entry["predicted_goodput"] = goodput
            entry["speedup"] = None if speedup != speedup else speedup
            model = f"model predicts {goodput:.0f} samples/s"
            if speedup == speedup:
                model += f" ({speedup:.2f}x one device)"
            parts.append(model)
        else:
            parts.append("no goodput model yet (the job has not reported step times)")
        entry["reason"] = "; ".join(parts) + f"; {context}"
        return entry
