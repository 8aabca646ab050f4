"""Batching, admission and cold starts of the request-level engine, on tiny hand-made inputs."""

from __future__ import annotations

import numpy as np

from shoal.serve.profiles import GroupSpec, WorkLatencyModel
from shoal.serve.sim.engine import BatchingConfig
from shoal.serve.sim.metrics import summarize_requests
from shoal.serve.sim.run import ReplicaGroup, sim_group, simulate, summarize
from shoal.serve.sim.workload import Workload


def _workload(arrivals: list[float], work: float = 1.0, models: list[int] | None = None):
    n = len(arrivals)
    return Workload(np.asarray(arrivals, float), np.asarray(models or [0] * n),
                    np.ones(n, int), np.ones(n, int), np.full(n, work))


def test_dynamic_batching_waits_then_fills(unit_devices):
    # per_batch_s makes batching pay: a batch of k costs 1 + 0.1 k.
    model = WorkLatencyModel(per_batch_s=1.0)
    wl = _workload([0.0, 0.1, 0.2, 0.3, 5.0], work=0.1)
    group = [ReplicaGroup(GroupSpec((unit_devices[0],), 1, 1), (0,))]
    cfg = BatchingConfig(max_batch=3, max_wait_s=0.5, admission=False)
    result = simulate(group, wl, model, np.full(len(wl), np.inf), cfg)
    # First batch fills at t=0.2 with 3 requests (1.3 s), request 3 waits for the server,
    # request 4 arrives alone and goes after max_wait.
    assert result.batch_sizes == [3, 1, 1]
    np.testing.assert_allclose(result.finish_s, [1.5, 1.5, 1.5, 2.6, 6.6])


def test_admission_rejects_requests_that_would_miss(unit_devices):
    wl = _workload([0.0, 0.0, 0.0, 0.0])
    deadline = np.full(4, 2.5)  # service 1 s each: only two can finish by 2.5
    group = [ReplicaGroup(GroupSpec((unit_devices[0],), 1, 1), (0,))]
    result = simulate(group, wl, WorkLatencyModel(), deadline, BatchingConfig())
    summary = summarize(result)
    assert summary["served"] == 2 and summary["rejected"] == 2
    assert summary["slo_attainment"] == 0.5
    # Without admission control every request is served, late ones too, and capacity is wasted.
    late = simulate(group, wl, WorkLatencyModel(), deadline, BatchingConfig(admission=False))
    assert summarize(late)["served"] == 4 and summarize(late)["slo_attainment"] == 0.5


def test_admission_keeps_capacity_for_requests_that_can_make_it(unit_devices):
    # A burst of hopeless requests followed by ones that can finish: admission serves the latter.
    wl = _workload([0.0] * 5 + [0.5] * 2)
    deadline = np.array([0.5] * 5 + [2.6, 3.6])
    group = [ReplicaGroup(GroupSpec((unit_devices[0],), 1, 1), (0,))]
    with_admission = summarize(simulate(group, wl, WorkLatencyModel(), deadline, BatchingConfig()))
    without = summarize(simulate(group, wl, WorkLatencyModel(), deadline,
                                 BatchingConfig(admission=False)))
    assert with_admission["slo_attainment"] == 2 / 7
    assert without["slo_attainment"] == 0.0


def test_cold_start_delays_first_batch(unit_devices):
    from shoal.serve.sim.engine import Engine

    wl = _workload([0.0, 0.1])
    latency = WorkLatencyModel(cold_start=3.0)
    engine = Engine(wl, np.full(2, np.inf), BatchingConfig(admission=False))
    spec = GroupSpec((unit_devices[0],), 1, 1)
    engine.add_group(sim_group(ReplicaGroup(spec, (0,)), latency, wl, cold=True))
    result = engine.run()
    np.testing.assert_allclose(result.finish_s, [4.0, 5.0])


def test_requests_of_unplaced_models_are_misses(unit_devices):
    wl = _workload([0.0, 1.0], models=[0, 1])
    group = [ReplicaGroup(GroupSpec((unit_devices[0],), 1, 1), (0,))]
    summary = summarize(simulate(group, wl, WorkLatencyModel(), np.full(2, 10.0),
                                 BatchingConfig()))
    assert summary["slo_attainment"] == 0.5 and summary["rejected"] == 1


def test_misses_split_into_late_and_not_served() -> None:
    summary = summarize_requests(np.array([0.0, 1.0, 2.0, 3.0]),
                                 np.array([0.5, 3.0, np.inf, 3.2]), np.full(4, 2.5))
    assert (summary["served"], summary["late"], summary["rejected"]) == (3, 2, 1)
    assert summary["slo_attainment"] == 0.25


def test_dispatch_balances_over_replicas(unit_devices):
    wl = _workload([0.0] * 4)
    groups = [ReplicaGroup(GroupSpec((unit_devices[i],), 1, 1), (0,)) for i in range(2)]
    result = simulate(groups, wl, WorkLatencyModel(), np.full(4, np.inf),
                      BatchingConfig(admission=False))
    np.testing.assert_allclose(sorted(result.finish_s), [1, 1, 2, 2])
    assert result.peak_devices == 2
