"""Deciding at arrivals and completions: a policy that asks for it starts a new job when it
arrives, and hands a finished job's devices out when it finishes."""

from __future__ import annotations

from shoal.backends.sim.run import simulate
from shoal.policy import make_policy
from shoal.policy.shoal import ShoalPolicy
from shoal.spec import JobSpec, parse_cluster

CLUSTER = parse_cluster({
    "name": "two-nodes", "device_types": [{"name": "t4", "memory_gb": 16}],
    "nodes": [{"device_type": "t4", "devices_per_node": 4, "count": 2}],
})
JOBS = [
    JobSpec(name="first", application="cifar10", batch_size=128, target_epochs=1),
    JobSpec(name="second", application="ncf", batch_size=256, target_epochs=1,
            submit_time=100.0),
]


def _starts(policy, profiles) -> tuple[dict[str, float], list[str]]:
    result = simulate(JOBS, policy, CLUSTER, profiles, interval=60.0)
    assert all(r.finish_time is not None and not r.failure for r in result.records)
    return {r.name: r.start_time for r in result.records}, [r.trigger for r in result.rounds]


def test_shoal_starts_a_job_at_its_arrival_and_periodic_policies_at_the_next_round(profiles):
    starts, triggers = _starts(ShoalPolicy(), profiles)
    assert starts == {"first": 0.0, "second": 100.0}
    assert triggers.count("arrival") == 2 and triggers[0] == "arrival"
    starts, triggers = _starts(ShoalPolicy(on_arrival=False, on_completion=False), profiles)
    assert starts["second"] == 120.0 and set(triggers) == {"interval"}
    starts, _ = _starts(make_policy("sia"), profiles)
    assert starts["second"] == 120.0



# Both jobs need the whole cluster and the first may not be preempted: the second waits.
QUEUED = [
    JobSpec(name="ahead", application="cifar10", batch_size=128, target_epochs=2,
            num_replicas=8, rigid=True, preemptible=False),
    JobSpec(name="behind", application="cifar10", batch_size=128, target_epochs=2,
            num_replicas=8, rigid=True, submit_time=10.0),
]


def _queued(policy, profiles):
    result = simulate(QUEUED, policy, CLUSTER, profiles, interval=60.0)
    records = {r.name: r for r in result.records}
    assert all(r.finish_time is not None and not r.failure for r in records.values())
    return records, [r.trigger for r in result.rounds]


def test_shoal_hands_out_a_finished_jobs_devices_when_it_finishes(profiles):
    records, triggers = _queued(ShoalPolicy(), profiles)
    finish = records["ahead"].finish_time
    assert finish % 60 != 0, "the first job must end between rounds for this test"
    assert records["behind"].start_time == finish
    assert triggers.count("completion") == 2  # each job's end; the second ends the run
    late, triggers = _queued(ShoalPolicy(on_completion=False), profiles)
    # Winding the simulator back to the first completion changes nothing that ran before it.
    assert late["ahead"].finish_time == finish
    assert late["behind"].start_time == 60 * (finish // 60 + 1)
    assert "completion" not in triggers
    late, triggers = _queued(make_policy("sia"), profiles)  # periodic rounds only
    assert all(r.start_time % 60 == 0 for r in late.values()) and set(triggers) == {"interval"}
