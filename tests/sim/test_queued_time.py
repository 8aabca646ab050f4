"""Per-job queued time in a run's report: the part of its JCT spent holding no devices."""

import pytest

from shoal.backends.sim.run import simulate
from shoal.core.state import JobRecord
from shoal.core.types import Allocation
from shoal.metrics.report import summarize
from shoal.policy import make_policy
from shoal.spec import JobSpec, parse_cluster

ONE_NODE = parse_cluster({
    "name": "one-node",
    "device_types": [{"name": "t4", "memory_gb": 16}],
    "nodes": [{"device_type": "t4", "devices_per_node": 4, "count": 1}],
})


def _rigid(name: str, submit: float) -> JobSpec:
    return JobSpec(name=name, application="cifar10", submit_time=submit, num_replicas=4,
                   min_replicas=4, max_replicas=4, batch_size=128, target_epochs=2)


def test_a_job_that_waits_for_the_whole_cluster_reports_its_wait_as_queued(profiles):
    # Two rigid jobs that each need every device: under FIFO the second waits for the first.
    result = simulate([_rigid("first", 0.0), _rigid("second", 10.0)], make_policy("fifo"),
                      ONE_NODE, profiles, interval=60.0, restart_delay=30.0, seed=0)
    report = summarize(result, fairness=False)
    jobs = {job["name"]: job for job in report["jobs"]}
    first, second = jobs["first"], jobs["second"]
    assert first["queued_s"] == pytest.approx(first["start_s"] - first["submit_s"])
    assert first["queued_s"] <= 60.0  # the first round
    # It held no devices from its submission until the first job's devices were free.
    assert second["queued_s"] == pytest.approx(second["start_s"] - second["submit_s"])
    assert second["start_s"] >= first["finish_s"]
    assert second["queued_s"] < second["jct_s"]
    assert report["summary"]["avg_queued_s"] == pytest.approx(
        (first["queued_s"] + second["queued_s"]) / 2)


def test_a_preempted_job_counts_the_time_it_was_stopped(profiles):
    # shoal starts the first job at once, stops it for the arrival (a rigid job that needs
    # every device and ranks first with no attained service) and resumes it after.
    result = simulate([_rigid("first", 0.0), _rigid("second", 10.0)], make_policy("shoal"),
                      ONE_NODE, profiles, interval=60.0, restart_delay=30.0, seed=0)
    report = summarize(result, fairness=False)
    first = next(job for job in report["jobs"] if job["name"] == "first")
    record = next(rec for rec in result.records if rec.name == "first")
    changes = [(time, allocation is None) for time, allocation in record.history]
    assert [stopped for _, stopped in changes] == [False, True, False], changes
    assert first["start_s"] == first["submit_s"]  # no wait before its first start
    (_, _), (stopped_at, _), (resumed_at, _) = changes
    assert resumed_at > stopped_at
    assert first["queued_s"] == pytest.approx(resumed_at - stopped_at)


def test_a_record_counts_queued_time_up_to_now_while_it_has_not_finished():
    record = JobRecord(spec=_rigid("job", 100.0))
    assert record.queued_seconds() is None  # neither finished nor asked up to a time
    assert record.queued_seconds(until=130.0) == 30.0  # never started
    two = Allocation("t4", (0, 0))
    record.history = [(130.0, two), (200.0, None), (260.0, two)]
    assert record.queued_seconds(until=230.0) == 30.0 + 30.0  # stopped at 200, still waiting
    assert record.queued_seconds(until=300.0) == 30.0 + 60.0
    record.finish_time = 400.0
    assert record.queued_seconds(until=10_000.0) == 90.0  # a finished job stops counting
