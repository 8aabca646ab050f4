"""The summary of a real run (``shoal demo``'s report) from the service's job list."""

import json

import pytest

from shoal.service import report


def _job(name: str, state: str, submit: float, finish: float | None, queued: float | None,
         runs: list[tuple[float, int]]) -> dict:
    return {"name": name, "state": state, "submit_time": submit, "finish_time": finish,
            "jct": None if finish is None else finish - submit, "queued_seconds": queued,
            "resizes": max(len(runs) - 1, 0), "device_seconds": 10.0, "batch_size": 64,
            "goodput": 100.0, "runs": [{"time": t, "replicas": n} for t, n in runs]}


def test_queued_time_is_averaged_over_finished_jobs_and_shown_per_job(tmp_path):
    jobs = [_job("a", "finished", 0.0, 100.0, 0.5, [(0.5, 1), (50.0, 2)]),
            _job("b", "finished", 10.0, 130.0, 30.5, [(40.5, 1)]),
            _job("c", "running", 20.0, None, 90.0, [])]  # still queued: not in the average
    summary = report.summarize(jobs)
    assert summary["avg_queued_s"] == pytest.approx((0.5 + 30.5) / 2)
    assert [row["queued_s"] for row in summary["jobs"]] == [0.5, 30.5, 90.0]
    assert summary["avg_jct_s"] == pytest.approx((100.0 + 120.0) / 2)
    paths = report.write(summary, tmp_path / "out", "run")
    assert json.loads(paths["json"].read_text())["avg_queued_s"] == summary["avg_queued_s"]
    page = paths["html"].read_text()
    assert "<th>queued s</th>" in page and "<td>30.5</td>" in page
    assert "queued 15.5 s" in page


def test_a_job_list_from_before_queued_times_still_summarizes(tmp_path):
    jobs = [_job("a", "finished", 0.0, 100.0, None, [(0.5, 1)])]
    summary = report.summarize(jobs)
    assert summary["avg_queued_s"] is None and summary["avg_jct_s"] == 100.0
    assert "queued - s" in report.write(summary, tmp_path, "run")["html"].read_text()
