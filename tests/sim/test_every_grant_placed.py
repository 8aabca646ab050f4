"""On a mixed cluster every policy asks only for devices that exist: each grant is placed.

A policy that counts free devices over the whole cluster can grant a job devices that no one
type holds; placement then leaves the grant unplaced and the job stops, while the policy
believes it runs.
"""

from pathlib import Path
from unittest import mock

import pytest

import shoal.core.scheduler as scheduler
from shoal.backends.sim.profile import ProfileLibrary
from shoal.backends.sim.run import simulate
from shoal.policy.registry import tuned_policy
from shoal.spec import load_cluster, load_workload_csv

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT.parent / "shared" / "data" / "pollux" / "workloads" / "workload-1.csv"


@pytest.mark.skipif(not WORKLOAD.exists(), reason="needs ../shared/data")
@pytest.mark.parametrize("policy", ["fifo", "tiresias", "optimus", "gavel", "pollux", "sia",
                                    "shoal"])
def test_every_grant_of_every_policy_is_placed_on_a_mixed_cluster(policy, tmp_path):
    head = tmp_path / "w20.csv"
    head.write_text("".join(WORKLOAD.read_text().splitlines(keepends=True)[:21]))
    unplaced: list[tuple[str, int]] = []
    scheduler_place = scheduler.place

    def recording_place(decision, cluster, current):
        placed = scheduler_place(decision, cluster, current)
        unplaced.extend((name, grant.replicas) for name, grant in decision.items()
                        if grant.replicas > 0 and name not in placed)
        return placed

    with mock.patch.object(scheduler, "place", recording_place):
        result = simulate(load_workload_csv(head), tuned_policy(policy, {}),
                          load_cluster("hetero-64"), ProfileLibrary(ROOT / "data" /
                                                                    "profiles-hetero"))
    assert all(r.finish_time is not None for r in result.records)
    assert unplaced == [], unplaced[:5]
