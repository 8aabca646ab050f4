"""Periodic re-placement baseline (Clockwork-like): every ``period_s`` the one-device-per-replica
greedy placement is recomputed from the requests of the previous period and applied; a device
whose models change finishes its queue, then loads the new models (cold start)."""

from __future__ import annotations

import math

import numpy as np

from shoal.serve.placement import PlacementProblem, selective_replication
from shoal.serve.profiles import GroupSpec
from shoal.serve.sim.engine import Engine, SimGroup, SimResult
from shoal.serve.sim.run import LatencyCache, ReplicaGroup, sim_group


def _window_problem(problem: PlacementProblem, start: float, end: float) -> PlacementProblem:
    lo, hi = np.searchsorted(problem.workload.arrival_s, [start, end])
    workload = problem.workload.window(start, end)
    return PlacementProblem(problem.cluster, workload, problem.latency,
                            problem.deadline_s[lo:hi], problem.batching, problem.num_models,
                            problem.target_attainment)


def periodic_replacement(problem: PlacementProblem, period_s: float = 60.0) -> SimResult:
    cache = LatencyCache(problem.latency, problem.workload)
    current: dict[int, SimGroup] = {}  # device id -> group on it

    def control(now: float, engine: Engine) -> None:
        # The first period has no history: it uses its own requests (an optimistic start).
        start, end = (now - period_s, now) if now > 0 else (0.0, period_s)
        window = _window_problem(problem, start, end)
        if len(window.workload) == 0:
            return
        choice = selective_replication(window)
        wanted = {g.spec.devices[0].device_id: g for g in choice.placement}
        # Models without requests last period still get one replica on a spare device.
        placed = {m for g in choice.placement for m in g.models}
        spare = [d for d in problem.cluster.devices if d.device_id not in wanted]
        for m in range(problem.num_models):
            if m not in placed and spare:
                device = spare.pop(0)
                wanted[device.device_id] = ReplicaGroup(GroupSpec((device,), 1, 1), (m,))
        # Devices the greedy left idle get extra replicas in proportion to last period's load.
        counts = np.bincount(window.workload.model, minlength=problem.num_models) + 1e-9
        extra = np.zeros(problem.num_models)
        for device in spare:
            m = int(np.argmax(counts / (extra + 1)))
            extra[m] += 1
            wanted[device.device_id] = ReplicaGroup(GroupSpec((device,), 1, 1), (m,))
        for device_id in set(current) | set(wanted):
            old = current.get(device_id)
            new = wanted.get(device_id)
            old_models = set(old.latency) if old else set()
            if new is not None and set(new.models) == old_models:
                continue
            begin = now
            if old is not None:
                begin = max(now, old.stage_free[-1]) + old.queued_work
                engine.retire_group(old)
                del current[device_id]
            if new is None:
                continue
            group = sim_group(ReplicaGroup(new.spec, new.models), problem.latency,
                              problem.workload, name=f"d{device_id}@{now:.0f}",
                              started_at=begin, cache=cache)
            for m in new.models:  # models already resident stay warm
                if m not in old_models:
                    group.ready_at[m] = begin + problem.latency.cold_start_s(m, new.spec)
            current[device_id] = engine.add_group(group)

    engine = Engine(problem.workload, problem.deadline_s, problem.batching,
                    controller=control, control_interval_s=period_s)
    result = engine.run()
    assert not math.isnan(result.device_seconds)
    return result
