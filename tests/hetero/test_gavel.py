"""Gavel: the max-min LP against hand-solved instances, its rounds, and a heterogeneous run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from shoal.core.types import (
    Allocation,
    ClusterState,
    JobLimits,
    JobState,
    JobView,
    ModelHints,
)
from shoal.policy import make_policy
from shoal.policy.gavel import GavelPolicy, max_min_allocation
from shoal.spec.cluster import NodeInfo
from shoal.spec.job import JobSpec

ROOT = Path(__file__).resolve().parents[2]
HETERO_PROFILES = ROOT / "data" / "profiles-hetero"


def test_lp_gives_each_job_the_type_it_is_relatively_fastest_on():
    # Types A, B with one device each; job 1 runs 2x faster on A, job 2 2x faster on B.
    # Normalizers T_eq = 1.5 for both, so job 1 scores 4/3 a1 + 2/3 b1 and job 2 the mirror.
    # Each score is at most 4/3, reached only by job 1 all on A and job 2 all on B.
    x, value = max_min_allocation(np.array([[2.0, 1.0], [1.0, 2.0]]), np.ones(2), np.ones(2),
                                  np.ones(2))
    assert value == pytest.approx(4 / 3)
    np.testing.assert_allclose(x, [[1.0, 0.0], [0.0, 1.0]], atol=1e-9)


def test_lp_matches_a_hand_solved_split():
    # Job 1: speeds (1, 2), T_eq 1.5 -> score 2/3 a1 + 4/3 b1. Job 2: (1, 5), T_eq 3 ->
    # 1/3 a2 + 5/3 b2. Job 1 full-time (a1 = 1 - b1) with job 2 taking what is left
    # (a2 = b1, b2 = 1 - b1) scores 2/3 + 2/3 b1 and 5/3 - 4/3 b1: equal at b1 = 1/2, t = 1.
    # The optimum is unique (each variable's min and max subject to t >= 1 are both 1/2).
    x, value = max_min_allocation(np.array([[1.0, 2.0], [1.0, 5.0]]), np.ones(2), np.ones(2),
                                  np.ones(2))
    assert value == pytest.approx(1.0)
    np.testing.assert_allclose(x, 0.5, atol=1e-9)


def test_lp_equalizes_device_time_across_scales_and_honours_weights():
    # Two types with two devices each, equal speeds; a 1-device and a 2-device job. Equal
    # device-time: the small job runs all the time, the big one half of it.
    x, value = max_min_allocation(np.ones((2, 2)), np.array([1.0, 2.0]), np.ones(2),
                                  np.array([2.0, 2.0]))
    assert value == pytest.approx(1.0)
    assert x[0].sum() == pytest.approx(1.0) and x[1].sum() == pytest.approx(0.5)
    # One device, two equal jobs, weights 1 and 3: time splits 1/4 : 3/4.
    x, value = max_min_allocation(np.ones((2, 1)), np.ones(2), np.array([1.0, 3.0]),
                                  np.array([1.0]))
    np.testing.assert_allclose(x[:, 0], [0.25, 0.75], atol=1e-9)


def test_jobs_that_cannot_run_anywhere_get_nothing():
    x, value = max_min_allocation(np.array([[1.0, 0.0], [0.0, 0.0]]), np.ones(2), np.ones(2),
                                  np.ones(2))
    assert x[1].sum() == 0 and x[0, 0] == pytest.approx(1.0)
    assert value > 0


class _Oracle:
    def __init__(self, speeds: dict[str, float]):
        self.speeds = speeds

    def throughput(self, device_type: str, num_replicas: int, batch_size: int) -> float:
        return self.speeds[device_type] * num_replicas

    def remaining_iterations(self, batch_size: int) -> float:
        return 1.0

    def step_time(self, num_replicas: int, batch_size: int) -> float:
        return 1.0


def _view(name: str, speeds: dict[str, float], running_on: str | None = None,
          replicas: int = 1) -> JobView:
    spec = JobSpec(name=name, application="cifar10", num_replicas=replicas, batch_size=128,
                   adaptive_batch=False)
    limits = JobLimits(init_batch_size=128, max_batch_size=4096, min_local_bsz=32,
                       max_local_bsz=1024, max_replicas=64)
    alloc = Allocation(running_on, (0,) * replicas) if running_on else None
    state = JobState.RUNNING if alloc else JobState.PENDING
    return JobView(name, spec, state, 0.0, 0.0, 0.0, 0, alloc, ModelHints(), limits,
                   _Oracle(speeds))


def _cluster(**devices: int) -> ClusterState:
    return ClusterState(tuple(NodeInfo(i, t, n) for i, (t, n) in enumerate(devices.items())))


def test_decision_places_jobs_on_their_relatively_faster_types():
    cluster = _cluster(t4=1, a100=1)
    jobs = [_view("likes-t4", {"t4": 2.0, "a100": 1.0}),
            _view("likes-a100", {"t4": 1.0, "a100": 4.0})]
    decision = GavelPolicy().decide(jobs, cluster, now=0.0)
    assert decision["likes-t4"].device_type == "t4"
    assert decision["likes-a100"].device_type == "a100"
    assert all(g.replicas == 1 and g.batch_size == 128 for g in decision.values())


def test_rounds_time_share_in_proportion_to_the_allocation():
    # Three equal 1-device jobs on two devices: each is allotted 2/3 of the time. Simulate the
    # round loop (a job runs in a round iff granted) and count rounds each job ran.
    cluster = _cluster(t4=2)
    policy = GavelPolicy(round_duration=360.0)
    running: dict[str, str | None] = {"a": None, "b": None, "c": None}
    ran = dict.fromkeys(running, 0)
    rounds = 60
    for r in range(rounds):
        views = [_view(n, {"t4": 1.0}, running_on=running[n]) for n in running]
        decision = policy.decide(views, cluster, now=360.0 * r)
        assert sum(g.replicas for g in decision.values()) == 2
        for name in running:
            running[name] = "t4" if name in decision else None
            ran[name] += name in decision
    for name, count in ran.items():
        assert count / rounds == pytest.approx(2 / 3, abs=0.05), (name, ran)


def test_hetero_simulation_finishes_every_job(tmp_path):
    """`shoal sim --policy gavel --cluster hetero-64 --profiles data/profiles-hetero` on the
    first 20 jobs of a Pollux workload."""
    from shoal.cli.main import cli

    lines = (ROOT.parent / "shared/data/pollux/workloads/workload-1.csv").read_text().splitlines()
    workload = tmp_path / "first20.csv"
    workload.write_text("\n".join(lines[:21]) + "\n")
    out = tmp_path / "report.json"
    result = CliRunner().invoke(cli, [
        "sim", "--workload", str(workload), "--policy", "gavel", "--cluster", "hetero-64",
        "--profiles", str(HETERO_PROFILES), "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["jobs"] == 20 and summary["finished"] == 20 and summary["failed"] == 0
    assert not summary["timed_out"]
    assert all(job["finish_s"] is not None for job in report["jobs"])


def test_hetero_simulation_uses_every_device_type():
    from shoal.backends.sim.profile import ProfileLibrary
    from shoal.backends.sim.run import simulate
    from shoal.spec import load_cluster, load_workload_csv

    jobs = load_workload_csv(ROOT.parent / "shared/data/pollux/workloads/workload-1.csv")[:20]
    result = simulate(jobs, make_policy("gavel"), load_cluster("hetero-64"),
                      ProfileLibrary(HETERO_PROFILES))
    used = {alloc.device_type for rec in result.records for _, alloc in rec.history if alloc}
    assert used == {"t4", "v100", "a100"}
    assert all(rec.finish_time is not None and not rec.failure for rec in result.records)
