"""bench/alone_bound.py: every job's JCT with the cluster to itself."""

import json
import math

import pytest

from tests.conftest import POLLUX
from tests.sim.bench_scripts import load


def test_sizes_are_sia_configurations():
    module = load("alone_bound")
    assert module._sizes(4, 3) == [1, 2, 4, 8, 12]
    assert module._sizes(8, 1) == [1, 2, 4, 8]


def test_alone_jct_is_the_shortest_run_and_fixed_sizes_follow_the_profile():
    module = load("alone_bound")
    result = module.alone_jcts({
        "workload": str(POLLUX / "workloads" / "workload-1.csv"), "name": "cifar10-0",
        "cluster": "pollux-t4-64", "profiles": str(POLLUX / "traces"),
        "policies": ["pollux"], "interval": 60.0, "restart_delay": 30.0})
    runs = result["runs"]
    assert "pollux" in runs and "t4x1" in runs and "t4x64" in runs
    assert result["alone_jct_s"] == min(runs.values()) == runs[result["best"]]
    # Alone at a fixed batch size, more devices first shorten the job, then communication
    # outweighs them: one device is the slowest, and the best size is neither end.
    assert runs["t4x1"] == max(runs.values())
    assert result["best"] not in ("t4x1", "t4x64")


def test_target_share_is_the_part_of_the_delay_above_alone_to_remove():
    module = load("alone_bound")
    row = {"alone_avg_jct_s": 1000.0, "shoal_avg_jct_s": 1800.0, "pollux_avg_jct_s": 2000.0}
    share = module._target_share(row, "shoal", "pollux", 0.8)
    assert share["target_avg_jct_s"] == pytest.approx(1600.0)
    assert share["delay_to_remove"] == pytest.approx(200.0 / 800.0)
    assert module._target_share({"alone_avg_jct_s": 1.0}, "shoal", "pollux", 0.8) == {}
    below = module._target_share({**row, "shoal_avg_jct_s": 900.0}, "shoal", "pollux", 0.8)
    assert math.isnan(below["delay_to_remove"])


def test_no_policy_is_refused_naming_the_option(capsys):
    module = load("alone_bound")
    with pytest.raises(SystemExit):
        module.main(["--workloads", "1", "--policies", " "])
    assert "--policies" in capsys.readouterr().err


def test_table_averages_read_both_comparison_formats(tmp_path):
    module = load("alone_bound")
    written = tmp_path / "run.json"  # as bench/policy_comparison.py --json writes it
    written.write_text(json.dumps({"runs": [
        {"cluster": "hetero-64", "policy": "shoal", "workload": "workload-1", "avg_jct_s": 10.0},
        {"cluster": "hetero-256", "policy": "shoal", "workload": "workload-1",
         "avg_jct_s": 99.0}]}))
    # bench/results/policy_comparison_1-8.json, as bench/comparison_table.py writes it
    published = tmp_path / "published.json"
    published.write_text(json.dumps({
        "hetero-64": {"shoal": {"per_workload": {"workload-1": {"avg_jct_s": 10.0}}}},
        "hetero-256": {"shoal": {"per_workload": {"workload-1": {"avg_jct_s": 99.0}}}},
        "environments": {}}))
    for path in (written, published):
        assert module._table_averages(path, "hetero-64") == {"workload-1": {"shoal": 10.0}}
    with pytest.raises(SystemExit, match=r"policy_comparison\.py --clusters pollux-t4-64"):
        module._table_averages(written, "pollux-t4-64")
