"""bench/by_application.py: per-application sums of two policies' cached job records."""

import json
from pathlib import Path

import pytest

from tests.sim.bench_scripts import load


def _report(cache: Path, name: str, jobs: list[tuple], version: str = "v1") -> None:
    """Job records (name, application, JCT, device-seconds[, queued seconds])."""
    (cache / version).mkdir(parents=True, exist_ok=True)
    records = [dict(zip(("name", "application", "jct_s", "device_seconds", "queued_s"), job,
                        strict=False)) for job in jobs]
    (cache / version / f"{name}-0123abcd.json").write_text(json.dumps({"jobs": records}))


def test_sums_per_application_over_the_workloads_both_ran(tmp_path):
    module = load("by_application")
    _report(tmp_path, "pollux-t4-64-shoal-workload-1",
            [("a-1", "cifar10", 100.0, 3600.0), ("b-2", "bert", 50.0, 7200.0),
             ("c-3", "bert", None, 10.0)])  # unfinished: left out
    _report(tmp_path, "pollux-t4-64-pollux-workload-1",
            [("a-1", "cifar10", 200.0, 1800.0), ("b-2", "bert", 100.0, 3600.0),
             ("c-3", "bert", 70.0, 10.0)])
    _report(tmp_path, "pollux-t4-64-shoal-workload-2", [("d-4", "ncf", 10.0, 36.0)])
    found = module.load(tmp_path, "v1", "pollux-t4-64", ("shoal", "pollux"))
    workloads, rows = module.by_application(found["shoal"], found["pollux"])
    assert workloads == ["workload-1"]  # workload-2 has no pollux run
    assert rows["cifar10"] == {"jobs": 1, "jct": 100.0, "reference_jct": 200.0,
                               "device_hours": 1.0, "reference_device_hours": 0.5}
    assert isinstance(rows["cifar10"]["jobs"], int)
    assert rows["bert"]["jobs"] == 1 and rows["bert"]["reference_jct"] == 100.0
    assert "ncf" not in rows


def test_missing_reports_name_the_command_that_makes_them(tmp_path):
    module = load("by_application")
    _report(tmp_path, "hetero-64-shoal-workload-1", [("a-1", "cifar10", 1.0, 1.0)])
    with pytest.raises(SystemExit, match=r"policy_comparison\.py --policies shoal,sia"):
        module.load(tmp_path, "v1", "hetero-64", ("shoal", "sia"))


def test_queued_hours_are_summed_only_when_every_report_records_them(tmp_path):
    module = load("by_application")
    _report(tmp_path, "hetero-64-shoal-workload-1",
            [("a-1", "cifar10", 100.0, 3600.0, 1800.0), ("b-2", "cifar10", 10.0, 36.0, 0.0)])
    _report(tmp_path, "hetero-64-sia-workload-1",
            [("a-1", "cifar10", 200.0, 1800.0, 3600.0), ("b-2", "cifar10", 20.0, 36.0, 360.0)])
    found = module.load(tmp_path, "v1", "hetero-64", ("shoal", "sia"))
    _, rows = module.by_application(found["shoal"], found["sia"])
    assert rows["cifar10"]["jobs"] == 2
    assert rows["cifar10"]["queued_hours"] == pytest.approx(0.5)
    assert rows["cifar10"]["reference_queued_hours"] == pytest.approx(1.1)
    # One report from before the queued time was recorded: no queued figures at all.
    _report(tmp_path, "hetero-64-shoal-workload-1",
            [("a-1", "cifar10", 100.0, 3600.0), ("b-2", "cifar10", 10.0, 36.0, 0.0)], "v2")
    _report(tmp_path, "hetero-64-sia-workload-1",
            [("a-1", "cifar10", 200.0, 1800.0, 3600.0), ("b-2", "cifar10", 20.0, 36.0, 360.0)],
            "v2")
    found = module.load(tmp_path, "v2", "hetero-64", ("shoal", "sia"))
    _, rows = module.by_application(found["shoal"], found["sia"])
    assert "queued_hours" not in rows["cifar10"] and rows["cifar10"]["jobs"] == 2
