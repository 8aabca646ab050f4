"""bench/policy_comparison.py: the acceptance ratios and each preset's profiles."""


import pytest

from tests.sim.bench_scripts import BENCH, load


def _summary(policy: str, workload: str, avg: float, p99: float = 1.0,
             makespan: float = 1.0) -> dict:
    return {"policy": policy, "workload": workload, "avg_jct_s": avg, "p99_jct_s": p99,
            "makespan_s": makespan}


def test_ratios_are_means_of_per_workload_ratios_over_common_workloads():
    module = load("policy_comparison")
    summaries = [
        _summary("shoal", "workload-1", 100.0, makespan=110.0),
        _summary("shoal", "workload-2", 900.0, makespan=90.0),
        _summary("pollux", "workload-1", 200.0, makespan=100.0),
        _summary("pollux", "workload-2", 1000.0, makespan=100.0),
        _summary("sia", "workload-1", 400.0),  # sia ran workload 1 only
    ]
    ratios = module.acceptance_ratios(summaries)
    # (0.5 + 0.9) / 2, not the ratio of the means (1000 / 1200).
    assert ratios["shoal / pollux avg_jct_s"] == pytest.approx(0.7)
    assert ratios["shoal / pollux makespan_s"] == pytest.approx(1.0)
    assert ratios["shoal / sia avg_jct_s"] == pytest.approx(0.25)
    assert ratios["sia / pollux avg_jct_s"] == pytest.approx(2.0)


def test_a_pair_without_common_workloads_has_no_ratio():
    module = load("policy_comparison")
    ratios = module.acceptance_ratios([_summary("shoal", "workload-1", 1.0),
                                       _summary("pollux", "workload-2", 1.0)])
    assert ratios == {}


def test_each_preset_reads_its_own_profiles():
    module = load("policy_comparison")
    assert module.profiles_for("hetero-64") == module.profiles_for("hetero-256") \
        == "data/profiles-hetero"
    assert (BENCH.parent / module.profiles_for("hetero-64")).is_dir()
    assert module.profiles_for("pollux-t4-64").endswith("traces")
