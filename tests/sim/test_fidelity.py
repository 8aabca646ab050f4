"""The simulator reproduces the Pollux artifact's published average JCTs (pollux-t4-64).

Reference: ../shared/data/pollux/results-jobload/<policy>-1.0/summary.json. Tolerances are the
acceptance bounds: 3% for the deterministic baselines, 10% for Pollux. The full 3 x 8 table is
in ``bench/sim_fidelity.py``.
"""

import json

import pytest

from shoal.backends.sim.run import simulate
from shoal.metrics.report import summarize
from shoal.policy import make_policy
from shoal.spec import load_cluster, load_workload_csv


def _avg_jct(policy, workload, pollux_data, profiles):
    jobs = load_workload_csv(pollux_data / "workloads" / f"workload-{workload}.csv")
    result = simulate(jobs, make_policy(policy), load_cluster("pollux-t4-64"), profiles)
    summary = summarize(result, fairness=False)["summary"]
    assert summary["finished"] == 160
    ref = json.loads(
        (pollux_data / "results-jobload" / f"{policy}-1.0" / "summary.json").read_text()
    )
    return summary["avg_jct_s"], ref["avgs"][f"workload-{workload}"]


@pytest.mark.parametrize(("policy", "workload", "tolerance"), [
    ("tiresias", 2, 0.03),
    ("optimus", 1, 0.03),
])
def test_baselines_match_the_artifact(policy, workload, tolerance, pollux_data, profiles):
    ours, reference = _avg_jct(policy, workload, pollux_data, profiles)
    assert ours == pytest.approx(reference, rel=tolerance)


@pytest.mark.slow
def test_pollux_matches_the_artifact(pollux_data, profiles):
    ours, reference = _avg_jct("pollux", 3, pollux_data, profiles)
    assert ours == pytest.approx(reference, rel=0.10)
