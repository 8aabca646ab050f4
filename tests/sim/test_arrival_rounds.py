"""Deciding at arrivals: a policy that asks for it starts a new job when it arrives."""

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
    assert starts["second"] == 100.0
    assert triggers.count("arrival") == 1 and triggers[0] == "interval"
    starts, triggers = _starts(ShoalPolicy(on_arrival=False), profiles)
    assert starts["second"] == 120.0 and set(triggers) == {"interval"}
    starts, _ = _starts(make_policy("sia"), profiles)
    assert starts["second"] == 120.0

