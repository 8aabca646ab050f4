"""The engine against closed-form queueing results (fixed seeds, enough requests)."""

from __future__ import annotations

import numpy as np

from shoal.serve.profiles import GroupSpec, WorkLatencyModel
from shoal.serve.sim.engine import BatchingConfig
from shoal.serve.sim.run import ReplicaGroup, simulate, summarize
from shoal.serve.sim.workload import gamma_workload, with_work

NO_SLO = BatchingConfig(max_batch=1, admission=False)


def _single_server_latency(work_kind: str, lam: float, n: int, seed: int, devices) -> float:
    rng = np.random.default_rng(seed)
    workload = gamma_workload([lam], 1.0, n / lam, rng)
    work = rng.exponential(1.0, len(workload)) if work_kind == "exp" else np.ones(len(workload))
    workload = with_work(workload, work)
    placement = [ReplicaGroup(GroupSpec((devices[0],), 1, 1), (0,))]
    result = simulate(placement, workload, WorkLatencyModel(), np.full(len(workload), np.inf),
                      NO_SLO)
    return summarize(result)["mean_latency_s"]


def test_mm1_mean_latency_matches_theory(unit_devices):
    lam, mu = 0.5, 1.0
    measured = _single_server_latency("exp", lam, 60_000, seed=3, devices=unit_devices)
    theory = 1.0 / (mu - lam)
    assert abs(measured - theory) / theory < 0.05, (measured, theory)


def test_md1_mean_latency_matches_theory(unit_devices):
    lam, service = 0.6, 1.0
    measured = _single_server_latency("det", lam, 60_000, seed=4, devices=unit_devices)
    rho = lam * service
    theory = service + rho * service / (2 * (1 - rho))  # Pollaczek-Khinchine, deterministic
    assert abs(measured - theory) / theory < 0.04, (measured, theory)


def test_two_models_on_a_two_stage_pipeline_halve_queueing_delay(unit_devices):
    """AlpaServe's multiplexing example: two models with Poisson arrivals and deterministic
    service L. Dedicated: two M/D/1 queues. Pipelined over both devices: one queue of the joint
    stream with stage time L/2, so the same utilisation with half the service time; the
    queueing delay (latency minus L) halves."""
    lam = 0.4
    rng = np.random.default_rng(7)
    workload = gamma_workload([lam, lam], 1.0, 40_000 / lam, rng)
    workload = with_work(workload, np.ones(len(workload)))
    no_deadline = np.full(len(workload), np.inf)
    d0, d1 = unit_devices[0], unit_devices[1]
    dedicated = [ReplicaGroup(GroupSpec((d0,), 1, 1), (0,)),
                 ReplicaGroup(GroupSpec((d1,), 1, 1), (1,))]
    pipelined = [ReplicaGroup(GroupSpec((d0, d1), 2, 1), (0, 1))]
    model = WorkLatencyModel()
    wait_dedicated = summarize(simulate(dedicated, workload, model, no_deadline, NO_SLO))[
        "mean_latency_s"] - 1.0
    wait_pipelined = summarize(simulate(pipelined, workload, model, no_deadline, NO_SLO))[
        "mean_latency_s"] - 1.0
    md1_wait = lam / (2 * (1 - lam))
    assert abs(wait_dedicated - md1_wait) / md1_wait < 0.06
    assert abs(wait_pipelined - md1_wait / 2) / (md1_wait / 2) < 0.06
    assert abs(wait_pipelined / wait_dedicated - 0.5) < 0.03
