"""Run a workload through the scheduler core on the simulator backend."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from shoal.backends.sim.backend import SimBackend
from shoal.backends.sim.isolated import isolated_jct
from shoal.backends.sim.planned import PlannedSimJob
from shoal.backends.sim.profile import ProfileLibrary
from shoal.core.scheduler import RoundStats, Scheduler
from shoal.core.state import JobRecord
from shoal.core.types import Policy
from shoal.perf.planned import PlanMode
from shoal.spec.cluster import ClusterSpec
from shoal.spec.job import JobSpec


@dataclass
class SimResult:
    policy: str
    cluster: ClusterSpec
    records: list[JobRecord]
    rounds: list[RoundStats]
    end_time: float
    timed_out: bool = False
    isolated_jct: dict[str, float] = field(default_factory=dict)
    # Jobs that declare a model: the plan of each allocation, in order.
    plans: dict[str, list[dict]] = field(default_factory=dict)
    # Serve and stream jobs: SLO attainment or lag, and their per-interval history.
    services: dict[str, dict] = field(default_factory=dict)


def simulate(
    jobs: Sequence[JobSpec],
    policy: Policy,
    cluster: ClusterSpec,
    profiles: ProfileLibrary,
    *,
    interval: float = 60.0,
    restart_delay: float = 30.0,
    seed: int = 0,
    max_time: float = 30 * 24 * 3600.0,
    on_round: Callable[[float, int, int], None] | None = None,
    plan_mode: PlanMode = "search",
    start_delay: float | None = None,
    resize_overlap: float = 0.0,
    finish_delay: float = 0.0,
    time_resolution: float = 1.0,
) -> SimResult:
    """Simulate ``jobs`` under ``policy`` until every job finishes or fails (or ``max_time``).

    Jobs run in the regime of the policy: a policy that does not adapt batch sizes runs each
    job at its user batch size. ``seed`` seeds Python's and NumPy's global generators for any
    randomized policy; the simulator itself is deterministic. ``plan_mode`` says how jobs
    that declare a model pick their parallel plan (see :mod:`shoal.perf.planned`).
    ``start_delay`` (default ``restart_delay``), ``resize_overlap`` and ``finish_delay``
    describe what starts, resizes and exits cost on the backend being modelled (see
    :class:`~shoal.backends.sim.job.SimJob`). Epochs end on multiples of ``time_resolution``
    seconds (1, as in the Pollux simulator; 0 for exact times, needed when epochs are short).
    """
    # Small BLAS calls (model fits) are several times slower with threads on few cores.
    with threadpool_limits(limits=1):
        return _simulate(jobs, policy, cluster, profiles, interval, restart_delay, seed,
                         max_time, on_round, plan_mode, start_delay, resize_overlap, finish_delay,
                         time_resolution)


def _simulate(jobs, policy, cluster, profiles, interval, restart_delay, seed, max_time,
              on_round, plan_mode="search", start_delay=None, resize_overlap=0.0,
              finish_delay=0.0, time_resolution=1.0) -> SimResult:
    random.seed(seed)
    np.random.seed(seed)
    backend = SimBackend(cluster, profiles, restart_delay=restart_delay, plan_mode=plan_mode,
                         start_delay=start_delay, resize_overlap=resize_overlap,
                         finish_delay=finish_delay, time_resolution=time_resolution)
    scheduler = Scheduler(policy, backend)
    for spec in sorted(jobs, key=lambda s: s.submit_time):
        regime = spec.model_copy(update={"adaptive_batch": policy.adapts_batch_size})
        scheduler.submit(regime)
    timed_out = False
    arrivals = sorted({s.submit_time for s in jobs}) if policy.decides_on_arrival else []
    next_arrival = 0
    on_completion = getattr(policy, "decides_on_completion", False)
    next_round = backend.now() + interval
    if arrivals and arrivals[0] <= backend.now():  # jobs present from the start
        scheduler.round(trigger="arrival")
    while scheduler.unfinished():
        now = backend.now()
        if now >= max_time:
            timed_out = True
            break
        while next_arrival < len(arrivals) and arrivals[next_arrival] <= now:
            next_arrival += 1
        until = next_round
        if next_arrival < len(arrivals) and arrivals[next_arrival] < next_round:
            until = arrivals[next_arrival]
        if on_completion:
            backend.advance_to_completion(until - now)
        else:
            backend.advance(until - now)
        if backend.now() < until:
            scheduler.round(trigger="completion")
        elif until >= next_round:
            next_round += interval
            scheduler.round()
        else:
            scheduler.round(trigger="arrival")
        if on_round is not None:
            done = len(scheduler.records) - len(scheduler.unfinished())
            on_round(backend.now(), done, len(scheduler.records))
    scheduler.observe()
    result = SimResult(
        policy=policy.name,
        cluster=cluster,
        records=list(scheduler.records.values()),
        rounds=scheduler.rounds,
        end_time=backend.now(),
        timed_out=timed_out,
    )
    result.isolated_jct = _isolated_jcts(result, backend)
    result.services = backend.services.summary()
    result.plans = {name: list(job.plan_history) for name, job in backend.jobs.items()
                    if isinstance(job, PlannedSimJob)}
    return result


def _isolated_jcts(result: SimResult, backend: SimBackend) -> dict[str, float]:
    """Each finished job's JCT alone on 1/n of the cluster (n: its average contention).

    1/n of a mixed cluster is 1/n of every device type; alone there, a job runs on whichever
    type of its share finishes it first (as in Gavel's heterogeneous finish-time fairness).
    """
    cluster = backend.cluster()
    out = {}
    for rec in result.records:
        if rec.finish_time is None or rec.limits is None or rec.failure or rec.spec.kind != "train":
            continue
        # Periodic rounds only: rounds run at arrivals would over-count contention.
        window = [r.active_jobs for r in result.rounds if r.trigger == "interval"
                  and rec.spec.submit_time <= r.time <= rec.finish_time]
        contention = max(sum(window) / len(window), 1.0) if window else 1.0
        allowed = rec.spec.device_types or cluster.device_types
        shares = {t: max(1, int(cluster.capacity(t) / contention))
                  for t in cluster.device_types if t in allowed}
        job = backend.jobs[rec.name]
        batch = rec.spec.batch_size or rec.limits.init_batch_size
        times = []
        for dtype, share in sorted(shares.items()):
            if isinstance(job, PlannedSimJob):
                times.append(job.isolated_jct(share, dtype) if dtype in job.models else None)
            elif dtype in job.app.devices:
                times.append(isolated_jct(job.app, rec.limits, batch, share,
                                          backend.per_node_by_type[dtype], dtype,
                                          backend.restart_delay, rec.spec.target_epochs,
                                          time_resolution=backend.time_resolution))
        known = [t for t in times if t is not None]
        if known:
            out[rec.name] = min(known)
    return out
