"""Invariants of any simulated run, over random small workloads and every policy."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.backends.sim.backend import SimBackend
from shoal.backends.sim.run import simulate
from shoal.core.types import JobState
from shoal.metrics.report import summarize
from shoal.policy import POLICIES, make_policy
from shoal.spec import JobSpec, load_cluster, parse_cluster

APPS = {"bert": [12, 24, 48], "cifar10": [128, 256, 512], "ncf": [256, 1024],
        "yolov3": [8, 16, 32], "deepspeech2": [20, 40], "imagenet": [200, 400]}
SMALL = parse_cluster({
    "name": "small",
    "device_types": [{"name": "t4", "memory_gb": 16}],
    "nodes": [{"device_type": "t4", "devices_per_node": 4, "count": 3}],
})


class CheckedBackend(SimBackend):
    """The simulator backend, asserting invariants at every change and every tick."""

    def apply(self, changes):
        super().apply(changes)
        used: dict[int, int] = {}
        for job in self.jobs.values():
            if job.allocation is not None and job.finished_at is None:
                for node, count in job.allocation.per_node().items():
                    used[node] = used.get(node, 0) + count
        capacity = {n.node_id: n.capacity for n in self.cluster().nodes}
        assert all(used[n] <= capacity[n] for n in used), "device over-committed"

    def advance(self, seconds):
        before = {n: (j.epoch, j.progress) for n, j in self.jobs.items()}
        super().advance(seconds)
        for name, job in self.jobs.items():
            assert (job.epoch, job.progress) >= before[name], "progress went backwards"


job_st = st.builds(
    lambda app, i, t, r, b, e: JobSpec(
        name=f"{app}-{i}", application=app, submit_time=t, num_replicas=r,
        batch_size=APPS[app][b % len(APPS[app])], target_epochs=e if app != "bert" else 1),
    st.sampled_from(sorted(APPS)), st.integers(0, 10_000), st.integers(0, 1800),
    st.integers(1, 6), st.integers(0, 2), st.integers(1, 3),
)


def _run(jobs, policy, monkeypatch, profiles, seed=0):
    monkeypatch.setattr("shoal.backends.sim.run.SimBackend", CheckedBackend)
    return simulate(jobs, make_policy(policy), SMALL, profiles, seed=seed)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(jobs=st.lists(job_st, min_size=1, max_size=6, unique_by=lambda j: j.name),
       policy=st.sampled_from(sorted(POLICIES)))
def test_invariants_hold_for_every_policy(jobs, policy, profiles):
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        result = _run(jobs, policy, mp, profiles)
    assert not result.timed_out
    for record in result.records:
        assert record.state in (JobState.FINISHED, JobState.FAILED)
        if record.state == JobState.FAILED:
            assert record.failure
        else:
            assert record.finish_time >= record.spec.submit_time


def test_unknown_application_fails_with_a_reason(profiles, monkeypatch):
    jobs = [JobSpec(name="a", application="no-such-model"),
            JobSpec(name="b", application="ncf", batch_size=256, target_epochs=1)]
    result = _run(jobs, "pollux", monkeypatch, profiles)
    by_name = {r.name: r for r in result.records}
    assert by_name["a"].state == JobState.FAILED
    assert "unknown application 'no-such-model'" in by_name["a"].failure
    assert by_name["b"].state == JobState.FINISHED


def test_runs_are_deterministic_for_a_seed(profiles, pollux_data):
    from shoal.spec import load_workload_csv

    jobs = load_workload_csv(pollux_data / "workloads" / "workload-4.csv")[:25]
    cluster = load_cluster("pollux-t4-64")
    first = summarize(simulate(jobs, make_policy("pollux"), cluster, profiles, seed=7))
    second = summarize(simulate(jobs, make_policy("pollux"), cluster, profiles, seed=7))
    for report in (first, second):
        report["summary"].pop("median_decision_ms")
        report["summary"].pop("p95_decision_ms")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_a_job_reports_progress_within_its_epoch_as_a_real_job_does(profiles):
    """The reported fraction done moves between epoch ends (the local backend reports its
    position within the epoch too), never backwards, and ends at 1."""
    from shoal.core.scheduler import Scheduler

    backend = SimBackend(SMALL, profiles)
    scheduler = Scheduler(make_policy("pollux"), backend)
    scheduler.submit(JobSpec(name="yolo", application="yolov3", submit_time=0,
                             num_replicas=1, batch_size=8, target_epochs=2))
    job = backend.jobs["yolo"]
    reported, within_epoch = [], 0
    while job.finished_at is None and backend.now() < 50 * 3600:
        scheduler.round()
        backend.advance(60)
        hints = job.hints()
        reported.append(hints.progress)
        if job.finished_at is None and hints.progress * job.max_epochs > job.epoch + 1e-9:
            within_epoch += 1
        assert job.epoch / job.max_epochs <= hints.progress <= (job.epoch + 1) / job.max_epochs
    assert job.finished_at is not None
    assert reported == sorted(reported) and reported[-1] == 1.0
    assert within_epoch > len(reported) // 2  # mostly between epoch ends, not stuck at them
