"""What one restart costs a job: measured by the local (and Ray) backend from its runs, modelled
by the simulator, and handed to the policy in every job's view."""

from __future__ import annotations

import pytest

from shoal.backends.local.job import restart_losses
from shoal.backends.sim.run import simulate
from shoal.policy.shoal import ShoalPolicy
from shoal.spec import JobSpec, parse_cluster


def test_restart_losses_count_from_the_decision_or_from_the_old_replicas_checkpoint() -> None:
    details = [
        # Started 6 s after the decision; checkpointed at 30 s for a resize decided at 22 s.
        {"kind": "start", "requested": 10.0, "first_step": 16.0, "checkpointed": 30.0},
        # Pre-warmed: the old replicas trained until their checkpoint, so only 30 -> 31 is lost.
        {"kind": "resize", "requested": 22.0, "first_step": 31.0, "checkpointed": None},
        # Preempted, then resumed 8 s after the decision.
        {"kind": "start", "requested": 50.0, "first_step": 58.0},
        # Crashed at about 60 s; the retry's processes started at 61 s, under the same decision.
        {"kind": "retry", "requested": 50.0, "time": 61.0, "first_step": 64.0},
        # Not yet at its first step: not counted.
        {"kind": "resize", "requested": 70.0, "first_step": None},
    ]
    assert restart_losses(details) == pytest.approx([6.0, 1.0, 8.0, 3.0])
    assert restart_losses([]) == []


class _Recording(ShoalPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, set[float | None]] = {}

    def decide(self, jobs, cluster, now):
        for job in jobs:
            self.seen.setdefault(job.name, set()).add(job.restart_seconds)
        return super().decide(jobs, cluster, now)


def test_the_simulator_hands_each_jobs_restart_cost_to_the_policy(profiles) -> None:
    cluster = parse_cluster({
        "name": "one-node", "device_types": [{"name": "t4", "memory_gb": 16}],
        "nodes": [{"device_type": "t4", "devices_per_node": 4, "count": 1}],
    })
    jobs = [JobSpec(name="a", application="cifar10", batch_size=128, target_epochs=5),
            JobSpec(name="b", application="ncf", batch_size=256, target_epochs=1,
                    submit_time=100.0)]
    policy = _Recording()
    result = simulate(jobs, policy, cluster, profiles, restart_delay=17.0)
    assert all(record.finish_time is not None for record in result.records)
    # Unknown before the job has reported (its first decision is made at arrival), then the
    # simulated cost; a move is charged four times that.
    assert policy.seen["a"] <= {None, 17.0} and 17.0 in policy.seen["a"]
