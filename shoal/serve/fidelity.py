"""Simulator fidelity against the real serving path on loopback.

1. Start replicas + router (:mod:`shoal.serve.launch`).
2. Profile the real path *as it serves on this machine*: replay the trace's ``profile_s``
   seconds from ``start_s`` open-loop through the router and read back, per request, its batch
   size, the batch's run time, its queueing time and when the replica received it. The run time
   per batch size (least-squares line over the observed batches) is the simulator's
   batch-latency table (:class:`BatchTableLatencyModel`); each request's HTTP time before the
   batcher (client send -> replica receipt) and after it (batch done -> answer at the client)
   is kept as a sample. The isolated profile (``POST /profile``: the model timed back to back in
   each replica) is reported next to it: on the shared 2-core machine a lone batch between idle
   gaps runs slower than back to back (cold caches, CPU contention with the router, the load
   generator and other work), so the isolated table alone would make the simulator optimistic.
3. Replay the next ``duration_s`` seconds of the trace open-loop through the router and through
   the simulator (one group per replica, same max batch / max wait, SLO-aware admission; each
   simulated request gets the (before, after) HTTP times of a profiled request drawn at
   random). The simulator gets the times requests actually left the load generator, so a late
   send on a busy machine is not counted as a simulator error; deadlines stay scheduled arrival
   + SLO for both, and latency is counted from the actual send for both.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

import httpx
import numpy as np

from shoal.serve.hardware import Device, Hardware
from shoal.serve.launch import ServingCluster, start_serving
from shoal.serve.loadgen import LoadResult, load_arrivals, run_open_loop
from shoal.serve.profiles import BatchTableLatencyModel, GroupSpec
from shoal.serve.sim.engine import BatchingConfig
from shoal.serve.sim.metrics import summarize_requests
from shoal.serve.sim.run import ReplicaGroup, simulate
from shoal.serve.sim.workload import Workload
from shoal.serve.wire import no_delay_transport
from shoal.spec.errors import SpecError

# One CPU replica as a simulator device. A batch-table latency model ignores the hardware
# figures; they are placeholders.
CPU_REPLICA = Hardware("cpu-replica", 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
MIN_BATCHES_PER_SIZE = 3


@dataclass(frozen=True)
class FidelityConfig:
    replicas: int = 2
    max_batch: int = 8
    max_wait_s: float = 0.005
    policy: str = "least-loaded"
    trace: str = "conv"
    start_s: float = 0.0  # offset into the rate-scaled trace
    duration_s: float = 25.0
    rate_scale: float = 5.0
    slo_s: float = 0.25
    profile_s: float = 8.0  # trace seconds before start_s + profile_s are the profiling load
    isolated_repeats: int = 5
    seed: int = 0


@dataclass(frozen=True)
class ServingProfile:
    """What the simulator is told about the real path: run time per batch size, and per
    profiled request the HTTP time before the batcher (client send -> server receipt) and after
    it (batch done -> client has the answer), in seconds."""

    batch_sizes: tuple[int, ...]
    latency_s: tuple[float, ...]
    overhead_in_s: tuple[float, ...]
    overhead_out_s: tuple[float, ...]

    def latency_model(self) -> BatchTableLatencyModel:
        return BatchTableLatencyModel(self.batch_sizes, self.latency_s)


async def isolated_profile(replica_urls: list[str], max_batch: int,
                           repeats: int) -> list[float]:
    """Mean over replicas of each replica's back-to-back model time per batch size."""
    sizes = list(range(1, max_batch + 1))
    async with httpx.AsyncClient(transport=no_delay_transport(), timeout=300.0) as client:
        answers = await asyncio.gather(*[
            client.post(f"{url}/profile", json={"batch_sizes": sizes, "repeats": repeats})
            for url in replica_urls])
    tables = []
    for answer in answers:
        answer.raise_for_status()
        tables.append(answer.json()["latency_s"])
    return [float(x) for x in np.mean(np.asarray(tables), axis=0)]


def fit_batch_latency(load: LoadResult, max_batch: int,
                      fallback: list[float]) -> tuple[list[float], dict[int, float]]:
    """(latency per batch size 1..max_batch, measured mean per observed size) from the batches
    a load run saw: a least-squares line ``a + b * size`` weighted by the number of batches;
    with fewer than two sizes seen, ``fallback`` scaled to the observed mean."""
    served = load.batch_size > 0
    sizes = load.batch_size[served]
    compute = load.compute_s[served]
    measured = {int(b): float(compute[sizes == b].mean()) for b in np.unique(sizes)}
    batches = {b: int((sizes == b).sum()) // b for b in measured}
    seen = [b for b in measured if batches[b] > 0]
    well_seen = [b for b in seen if batches[b] >= MIN_BATCHES_PER_SIZE]
    if len(well_seen) >= 2:
        # A size seen in one or two batches (a short window's rare large batches) would set
        # the slope on its own and the line is extrapolated up to max_batch.
        seen = well_seen
    grid = np.arange(1, max_batch + 1)
    if len(seen) >= 2:
        x = np.asarray(seen, dtype=float)
        weights = np.sqrt([batches[b] for b in seen])
        slope, intercept = np.polyfit(x, [measured[b] for b in seen], 1, w=weights)
        table = intercept + max(slope, 0.0) * grid
    elif seen:
        b = seen[0]
        table = np.asarray(fallback) * (measured[b] / fallback[b - 1])
    else:
        table = np.asarray(fallback)
    table = np.maximum.accumulate(np.maximum(table, 1e-4))
    return [float(t) for t in table], measured


def http_overhead(load: LoadResult) -> tuple[list[float], list[float]]:
    """Per served request: (send -> server receipt, batch done -> answer at the client)."""
    served = load.batch_size > 0
    before = (load.received_s - load.sent_s)[served]
    after = (load.finish_s - load.received_s - load.queue_s - load.compute_s)[served]
    keep = np.isfinite(before) & np.isfinite(after)
    return ([max(0.0, float(x)) for x in before[keep]],
            [max(0.0, float(x)) for x in after[keep]])


def simulate_replay(load: LoadResult, profile: ServingProfile, replicas: int, max_batch: int,
                    max_wait_s: float, seed: int = 0) -> dict[str, float]:
    """The simulator's prediction of what the load generator saw, for the requests it sent (at
    the times they actually left the client). Each request gets the HTTP times (before, after
    the batcher) of a profiled request drawn at random."""
    n = len(load.sent_s)
    pick = np.random.default_rng(seed).integers(0, max(1, len(profile.overhead_in_s)), size=n)
    before = np.asarray(profile.overhead_in_s or (0.0,))[pick]
    after = np.asarray(profile.overhead_out_s or (0.0,))[pick]
    at_server = load.sent_s + before
    order = np.argsort(at_server, kind="stable")
    ones = np.ones(n, dtype=np.int64)
    workload = Workload(at_server[order], np.zeros(n, dtype=np.int64), ones, ones)
    placement = [ReplicaGroup(GroupSpec((Device(i, 0, CPU_REPLICA),), 1, 1), (0,))
                 for i in range(replicas)]
    # The server judges admission against the client's absolute deadline.
    deadline = load.deadline_s[order]
    result = simulate(placement, workload, profile.latency_model(), deadline,
                      BatchingConfig(max_batch=max_batch, max_wait_s=max_wait_s,
                                     admission=True))
    sent = load.sent_s[order]
    back = np.argsort(sent, kind="stable")
    summary = summarize_requests(sent[back], (result.finish_s + after[order])[back],
                                 deadline[back])
    summary["mean_batch_size"] = float(np.mean(result.batch_sizes)) if result.batch_sizes \
        else 0.0
    return summary


def real_summary(load: LoadResult) -> dict[str, float]:
    """The load run's metrics with latency counted from the actual send, like the simulator's
    (the load generator's own report counts from the scheduled arrival)."""
    order = np.argsort(load.sent_s, kind="stable")
    summary = summarize_requests(load.sent_s[order], load.finish_s[order],
                                 load.deadline_s[order])
    served = load.batch_size > 0
    summary["mean_batch_size"] = float(load.batch_size[served].mean()) if served.any() else 0.0
    summary["p99_send_lag_s"] = load.summary.get("p99_send_lag_s", 0.0)
    summary["errors"] = load.summary.get("errors", 0)
    summary["rejected_503"] = load.summary.get("rejected_503", 0)
    return summary


def trace_windows(config: FidelityConfig) -> tuple[np.ndarray, np.ndarray]:
    """(profiling arrivals, replay arrivals): the trace's ``profile_s`` seconds from
    ``start_s``, then the ``duration_s`` seconds after them (same burst character, other
    requests), each shifted to start at 0."""
    split = config.start_s + config.profile_s
    end = split + config.duration_s
    arrival = load_arrivals(config.trace, end, config.rate_scale)
    windows = []
    for lo, hi, name in ((config.start_s, split, "profile_s"), (split, end, "duration_s")):
        part = arrival[(arrival >= lo) & (arrival < hi)]
        if len(part) < 2:
            raise SpecError(f"fewer than 2 arrivals in [{lo:g}, {hi:g}) s of the rate-scaled "
                            "trace; move start_s or lengthen the window", field=name)
        windows.append(part - lo)
    return windows[0], windows[1]


def _p50_p99(samples: list[float]) -> list[float]:
    return [float(x) for x in np.percentile(samples, [50, 99])] if samples else [0.0, 0.0]


def compare(real: dict[str, float], sim: dict[str, float]) -> dict[str, float]:
    return {
        "attainment_gap_points": 100.0 * abs(real["slo_attainment"] - sim["slo_attainment"]),
        "p99_relative_error": abs(real["p99_latency_s"] - sim["p99_latency_s"])
        / real["p99_latency_s"],
        "p50_relative_error": abs(real["p50_latency_s"] - sim["p50_latency_s"])
        / real["p50_latency_s"],
    }


def measured_profile(load: LoadResult, max_batch: int,
                     fallback: list[float]) -> tuple[ServingProfile, dict[int, float]]:
    """The profile a load run measured (batch table and HTTP times), and its mean run time
    per observed batch size."""
    table, measured = fit_batch_latency(load, max_batch, fallback)
    before, after = http_overhead(load)
    return (ServingProfile(tuple(range(1, max_batch + 1)), tuple(table), tuple(before),
                           tuple(after)), measured)


def _profile_report(profile: ServingProfile, measured: dict[int, float]) -> dict:
    return {"batch_latency_s": list(profile.latency_s),
            "http_before_p50_p99_s": _p50_p99(list(profile.overhead_in_s)),
            "http_after_p50_p99_s": _p50_p99(list(profile.overhead_out_s)),
            "measured_batch_latency_s": {str(k): v for k, v in measured.items()}}


async def run_fidelity_on(cluster: ServingCluster, config: FidelityConfig) -> dict:
    """Profile the running ``cluster``, replay the arrivals through it and the simulator.

    Two predictions of the replay: ``sim`` from the profile measured before it (what a user
    of the simulator has), and ``sim_same_run`` from the profile the replay itself measured
    (batch table and HTTP times of its own requests). The second isolates the simulator's
    queueing, batching, routing and admission from the machine changing speed between the
    profiling window and the replay, which on a shared machine moves the first by tens of
    percent (``docs/serving.md``)."""
    profiling_arrivals, replay = trace_windows(config)
    isolated = await isolated_profile(cluster.replica_urls, config.max_batch,
                                      config.isolated_repeats)
    profiling = await run_open_loop(cluster.url, profiling_arrivals, config.slo_s)
    profile, measured = measured_profile(profiling, config.max_batch, isolated)
    load = await run_open_loop(cluster.url, replay, config.slo_s)
    real = real_summary(load)
    sim = simulate_replay(load, profile, config.replicas, config.max_batch, config.max_wait_s,
                          config.seed)
    same_run, same_measured = measured_profile(load, config.max_batch, isolated)
    sim_same_run = simulate_replay(load, same_run, config.replicas, config.max_batch,
                                   config.max_wait_s, config.seed)
    return {"config": asdict(config),
            "profile": {**_profile_report(profile, measured),
                        "isolated_batch_latency_s": isolated,
                        "requests": len(profiling_arrivals)},
            "profile_same_run": _profile_report(same_run, same_measured),
            "loadgen": load.summary, "real": real, "sim": sim, "gap": compare(real, sim),
            "sim_same_run": sim_same_run, "gap_same_run": compare(real, sim_same_run)}


def run_fidelity(config: FidelityConfig) -> dict:
    """Start a serving cluster for ``config``, run the check, stop the cluster."""
    with start_serving(replicas=config.replicas, max_batch=config.max_batch,
                       max_wait_s=config.max_wait_s, policy=config.policy) as cluster:
        return asyncio.run(run_fidelity_on(cluster, config))
