"""Simulator fidelity against the real serving path on loopback.

1. Start replicas + router (:mod:`shoal.serve.launch`).
2. Profile: each replica times its model per batch size on its inference thread
   (``POST /profile``, all replicas at once, as they run at once under load); the mean over
   replicas is the simulator's batch-latency table (:class:`BatchTableLatencyModel`).
3. Calibrate the HTTP path: a few lone requests through the router; the client-seen latency
   minus the server's own queue + compute time is the per-request overhead (two loopback hops,
   JSON, event loops). The simulator gets half of it before the batcher and half after.
4. Replay the same arrivals open-loop through the router and through the simulator (one group
   per replica, same max batch / max wait, SLO-aware admission) and compare.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass

import httpx
import numpy as np

from shoal.serve.hardware import Device, Hardware
from shoal.serve.launch import ServingCluster, start_serving
from shoal.serve.loadgen import load_arrivals, run_open_loop
from shoal.serve.profiles import BatchTableLatencyModel, GroupSpec
from shoal.serve.sim.engine import BatchingConfig
from shoal.serve.sim.metrics import summarize_requests
from shoal.serve.sim.run import ReplicaGroup, simulate
from shoal.serve.sim.workload import Workload
from shoal.serve.wire import example_tokens, no_delay_transport
from shoal.spec.errors import SpecError

# One CPU replica as a simulator device. A batch-table latency model ignores the hardware
# figures; they are placeholders.
CPU_REPLICA = Hardware("cpu-replica", 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


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
    slo_s: float = 0.1
    profile_repeats: int = 15
    calibration_requests: int = 20


@dataclass(frozen=True)
class ServingProfile:
    """What the simulator is told about the real path."""

    batch_sizes: tuple[int, ...]
    latency_s: tuple[float, ...]
    overhead_s: float

    def latency_model(self) -> BatchTableLatencyModel:
        return BatchTableLatencyModel(self.batch_sizes, self.latency_s)


async def profile_replicas(replica_urls: list[str], max_batch: int,
                           repeats: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    sizes = list(range(1, max_batch + 1))
    async with httpx.AsyncClient(transport=no_delay_transport(), timeout=300.0) as client:
        answers = await asyncio.gather(*[
            client.post(f"{url}/profile", json={"batch_sizes": sizes, "repeats": repeats})
            for url in replica_urls])
    tables = []
    for answer in answers:
        answer.raise_for_status()
        tables.append(answer.json()["latency_s"])
    mean = np.mean(np.asarray(tables), axis=0)
    return tuple(sizes), tuple(float(x) for x in np.maximum.accumulate(mean))


async def measure_overhead(url: str, requests: int, gap_s: float = 0.02) -> float:
    """Median of (client-seen latency - server queue - server compute) over lone requests."""
    samples = []
    async with httpx.AsyncClient(transport=no_delay_transport(), timeout=30.0) as client:
        for i in range(requests):
            started = time.perf_counter()
            answer = await client.post(f"{url}/infer", json={"tokens": example_tokens(i)})
            seen = time.perf_counter() - started
            answer.raise_for_status()
            body = answer.json()
            samples.append(seen - body["queue_s"] - body["compute_s"])
            await asyncio.sleep(gap_s)
    return max(0.0, statistics.median(samples))


async def profile_path(cluster: ServingCluster, config: FidelityConfig) -> ServingProfile:
    sizes, latency = await profile_replicas(cluster.replica_urls, config.max_batch,
                                            config.profile_repeats)
    overhead = await measure_overhead(cluster.url, config.calibration_requests)
    return ServingProfile(sizes, latency, overhead)


def simulate_replay(arrival_s: np.ndarray, slo_s: float, profile: ServingProfile,
                    replicas: int, max_batch: int, max_wait_s: float) -> dict[str, float]:
    """The simulator's prediction of what the load generator sees for these arrivals."""
    half = profile.overhead_s / 2.0
    n = len(arrival_s)
    ones = np.ones(n, dtype=np.int64)
    workload = Workload(arrival_s + half, np.zeros(n, dtype=np.int64), ones, ones)
    placement = [ReplicaGroup(GroupSpec((Device(i, 0, CPU_REPLICA),), 1, 1), (0,))
                 for i in range(replicas)]
    # The server judges admission against the client's absolute deadline.
    deadline = arrival_s + slo_s
    result = simulate(placement, workload, profile.latency_model(), deadline,
                      BatchingConfig(max_batch=max_batch, max_wait_s=max_wait_s,
                                     admission=True))
    summary = summarize_requests(arrival_s, result.finish_s + half, deadline)
    summary["mean_batch_size"] = float(np.mean(result.batch_sizes)) if result.batch_sizes \
        else 0.0
    return summary


def replay_arrivals(config: FidelityConfig) -> np.ndarray:
    arrival = load_arrivals(config.trace, config.start_s + config.duration_s, config.rate_scale)
    arrival = arrival[arrival >= config.start_s]
    if len(arrival) < 2:
        raise SpecError(f"fewer than 2 arrivals in [{config.start_s}, "
                        f"{config.start_s + config.duration_s}) s of the rate-scaled trace",
                        field="start_s")
    return arrival - config.start_s


def compare(real: dict[str, float], sim: dict[str, float]) -> dict[str, float]:
    return {
        "attainment_gap_points": 100.0 * abs(real["slo_attainment"] - sim["slo_attainment"]),
        "p99_relative_error": abs(real["p99_latency_s"] - sim["p99_latency_s"])
        / real["p99_latency_s"],
        "p50_relative_error": abs(real["p50_latency_s"] - sim["p50_latency_s"])
        / real["p50_latency_s"],
    }


async def run_fidelity_on(cluster: ServingCluster, config: FidelityConfig) -> dict:
    """Profile the running ``cluster``, replay the arrivals through it and the simulator."""
    arrival = replay_arrivals(config)
    profile = await profile_path(cluster, config)
    load = await run_open_loop(cluster.url, arrival, config.slo_s)
    sim = simulate_replay(arrival, config.slo_s, profile, config.replicas, config.max_batch,
                          config.max_wait_s)
    return {"config": asdict(config), "profile": asdict(profile), "real": load.summary,
            "sim": sim, "gap": compare(load.summary, sim)}


def run_fidelity(config: FidelityConfig) -> dict:
    """Start a serving cluster for ``config``, run the check, stop the cluster."""
    with start_serving(replicas=config.replicas, max_batch=config.max_batch,
                       max_wait_s=config.max_wait_s, policy=config.policy) as cluster:
        return asyncio.run(run_fidelity_on(cluster, config))
