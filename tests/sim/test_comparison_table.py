"""bench/comparison_table.py: which cached version each table row comes from."""

import json
from pathlib import Path

from tests.sim.bench_scripts import load


def _report(cache: Path, version: str, name: str, avg: float) -> None:
    (cache / version).mkdir(parents=True, exist_ok=True)
    (cache / version / f"{name}-0123abcd.json").write_text(
        json.dumps({"summary": {"avg_jct_s": avg}}))


def test_fresh_policies_come_only_from_the_first_versions(tmp_path):
    collect = load("comparison_table").collect
    _report(tmp_path, "new", "hetero-256-shoal-workload-2", 1.0)
    _report(tmp_path, "refactor", "pollux-t4-64-shoal-workload-1", 2.0)
    _report(tmp_path, "old", "pollux-t4-64-shoal-workload-3", 3.0)
    _report(tmp_path, "old", "pollux-t4-64-pollux-workload-1", 4.0)
    versions = ["new", "refactor", "old"]

    one = collect(tmp_path, versions, fresh="shoal")
    assert set(one) == {("hetero-256", "shoal", "workload-2"),
                        ("pollux-t4-64", "pollux", "workload-1")}

    two = collect(tmp_path, versions, fresh="shoal", fresh_versions=2)
    assert two[("pollux-t4-64", "shoal", "workload-1")]["source_version"] == "refactor"
    assert ("pollux-t4-64", "shoal", "workload-3") not in two
    assert two[("pollux-t4-64", "pollux", "workload-1")]["source_version"] == "old"

    every = collect(tmp_path, versions)
    assert every[("pollux-t4-64", "shoal", "workload-3")]["avg_jct_s"] == 3.0


def test_each_version_names_the_machines_it_ran_on(tmp_path):
    module = load("comparison_table")
    _report(tmp_path, "new", "pollux-t4-64-shoal-workload-1", 1.0)
    (tmp_path / "new" / "environment-1a2b3c4d.json").write_text(
        json.dumps({"cpu": "AMD EPYC", "scipy": "1.17.1"}))
    assert set(module.collect(tmp_path, ["new"])) == {("pollux-t4-64", "shoal", "workload-1")}
    assert module.environments(tmp_path, ["new", "absent"]) == {
        "new": [{"cpu": "AMD EPYC", "scipy": "1.17.1"}]}


def test_a_policy_missing_from_the_cache_comes_whole_from_the_base_table(tmp_path):
    module = load("comparison_table")
    _report(tmp_path, "new", "pollux-t4-64-shoal-workload-1", 1.0)
    found = module.collect(tmp_path, ["new"])
    base = {
        "pollux-t4-64": {
            "shoal": {"per_workload": {"workload-1": {"avg_jct_s": 9.0, "source_version": "old"},
                                       "workload-2": {"avg_jct_s": 9.0, "source_version": "old"}}},
            "pollux": {"per_workload": {"workload-1": {"avg_jct_s": 4.0,
                                                       "source_version": "old"}}}},
        "environments": {"old": [{"cpu": "AMD EPYC"}]}}
    added = module.from_base(base, found)
    # shoal has a report in the cache, so none of its base rows is mixed in.
    assert set(added) == {("pollux-t4-64", "pollux", "workload-1")}
    assert added[("pollux-t4-64", "pollux", "workload-1")]["source_version"] == "old"


def test_main_writes_the_cached_rows_and_the_base_tables_other_policies(tmp_path, monkeypatch):
    module = load("comparison_table")
    columns = [key for _, key, _ in module.METRICS]
    (tmp_path / "cache" / "new").mkdir(parents=True)
    (tmp_path / "cache" / "new" / "hetero-64-shoal-workload-1-0123abcd.json").write_text(
        json.dumps({"summary": dict.fromkeys(columns, 1.0)}))
    row = {**dict.fromkeys(columns, 2.0), "source_version": "old"}
    base = tmp_path / "base.json"
    base.write_text(json.dumps({
        "hetero-64": {"shoal": {"per_workload": {"workload-1": row}},
                      "sia": {"per_workload": {"workload-1": row}}},
        "environments": {"old": [{"cpu": "Intel Xeon"}], "older": [{"cpu": "unused"}]}}))
    out = tmp_path / "out.json"
    monkeypatch.setattr("sys.argv", ["comparison_table.py", "--cache", str(tmp_path / "cache"),
                                     "--versions", "new", "--base", str(base),
                                     "--json", str(out)])
    module.main()
    table = json.loads(out.read_text())
    assert table["hetero-64"]["shoal"]["avg_jct_s"] == 1.0  # the cache's, not the base's
    assert table["hetero-64"]["sia"]["per_workload"]["workload-1"]["source_version"] == "old"
    assert table["environments"] == {"old": [{"cpu": "Intel Xeon"}], "new": []}
