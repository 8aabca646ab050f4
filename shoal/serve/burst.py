"""A burst scenario for autoscaling with co-location: one model served next to elastic
training jobs; a rate step-up is absorbed by devices lent by training and returned after."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.serve.autoscale import Autoscaler, AutoscalingConfig
from shoal.serve.colocation import ElasticTrainingJob, TrainingLender
from shoal.serve.hardware import Device, Hardware
from shoal.serve.profiles import WorkLatencyModel
from shoal.serve.sim.engine import BatchingConfig, Engine
from shoal.serve.sim.metrics import summarize_requests
from shoal.serve.sim.run import LatencyCache
from shoal.serve.sim.workload import Workload, gamma_arrivals, with_work


@dataclass(frozen=True)
class BurstScenario:
    base_rate: float = 5.0  # requests/s before and after the burst
    burst_rate: float = 40.0
    burst_start_s: float = 60.0
    burst_end_s: float = 120.0
    duration_s: float = 240.0
    service_s: float = 0.1  # per request on one device
    slo_s: float = 1.0
    serving_devices: int = 2
    training_jobs: int = 2
    devices_per_training_job: int = 4
    cold_start_s: float = 0.3
    seed: int = 0


def burst_workload(s: BurstScenario) -> Workload:
    rng = np.random.default_rng(s.seed)
    parts = [
        gamma_arrivals(s.base_rate, 1.0, s.burst_start_s, rng),
        s.burst_start_s + gamma_arrivals(s.burst_rate, 1.0, s.burst_end_s - s.burst_start_s, rng),
        s.burst_end_s + gamma_arrivals(s.base_rate, 1.0, s.duration_s - s.burst_end_s, rng),
    ]
    arrival = np.concatenate(parts)
    n = len(arrival)
    wl = Workload(arrival, np.zeros(n, np.int64), np.ones(n, np.int64), np.ones(n, np.int64))
    return with_work(wl, np.full(n, s.service_s))


def run_burst(s: BurstScenario, config: AutoscalingConfig, lend: bool = True,
              control_interval_s: float = 0.25) -> dict:
    hardware = Hardware("unit", 100.0, 16.0, 100.0, 100.0, 100.0, 10.0)
    workload = burst_workload(s)
    latency = WorkLatencyModel(cold_start=s.cold_start_s)
    jobs = [ElasticTrainingJob(f"train-{i}", s.devices_per_training_job)
            for i in range(s.training_jobs)]
    lender = TrainingLender(jobs) if lend else None
    scaler = Autoscaler(0, config, [Device(i, 0, hardware) for i in range(s.serving_devices)],
                        latency, LatencyCache(latency, workload), lender)
    engine = Engine(workload, workload.arrival_s + s.slo_s, BatchingConfig(max_batch=1),
                    controller=scaler, control_interval_s=control_interval_s)
    result = engine.run()
    summary = summarize_requests(workload.arrival_s, result.finish_s, result.deadline_s)
    summary["peak_replicas"] = max(n for _, n in scaler.history)
    summary["final_replicas"] = scaler.history[-1][1]
    if lender is not None:
        summary.update(lender.report(s.duration_s))
    summary["training_devices_over_time"] = {j.name: j.history for j in jobs}
    return summary
