"""The web dashboard in a real browser: headless Chromium (Playwright) against a real service.

Two tiny training jobs run on three CPU slots; the page must show them in the table, colour
the devices they hold, explain a job's allocation on click and follow the jobs to the end
without a reload. The browser is ``tests/service/browser.py``'s (skipped without
``/usr/bin/chromium``, except under ``CI``). ``tests/local/test_planned_jobs.py`` checks the
page's parallel plan.
``SHOAL_DASHBOARD_SCREENSHOT=docs/img/dashboard.png`` also saves the screenshot there.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.service.config import ServiceConfig
from shoal.service.runner import Runner
from shoal.spec.job import parse_job
from tests.service.browser import MISSING, chromium
from tests.service.helpers import REPO, Service, job_yaml, running_service, wait_until

WAIT_MS = 45_000
GRID_MATCHES_TABLE = """name => {
  const cell = document.querySelector(`#jobs tr[data-job="${name}"] td.allocation`);
  const match = cell && cell.textContent.match(/^(\\d+) × cpu on node 0$/);
  const held = document.querySelectorAll(`#nodes .device.held[data-job="${name}"]`).length;
  return Boolean(match) && Number(match[1]) === held;
}"""


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as launched:
        if launched is None:
            pytest.skip(MISSING)
        yield launched


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    with running_service(tmp_path / "home", slots=3) as svc:
        yield svc


def test_runner_explains_grants_and_serves_newest_events(tmp_path: Path) -> None:
    """The fields the dashboard reads: a job's latest decision and the newest events."""
    runner = Runner(ServiceConfig(home=tmp_path / "home", port=1, slots=2, interval_s=0.2))
    try:
        quick = parse_job({"name": "quick", "application": "x",
                           "command": ["python", "-c", "import time; time.sleep(1)"]})
        runner.submit(quick, REPO)
        assert runner.job("quick")["decision"] is None  # no round yet
        runner.round()
        decision = runner.job("quick")["decision"]
        assert decision["policy"] == "pollux" and decision["replicas"] >= 1
        assert decision["reason"].startswith(f"pollux granted {decision['replicas']} x cpu")
        assert decision["capacity"] == 2 and decision["competing_jobs"] == 1
        runner.round()  # nothing changed: no second explanation
        kinds = [e["kind"] for e in runner.events("quick", 0)]
        assert kinds == ["submitted", "restarting", "decision"], kinds
        assert runner.events("quick", 0)[-1]["detail"] == decision["reason"]
        newest = runner.events(None, 0, last=2)
        assert [e["kind"] for e in newest] == ["restarting", "decision"]
        assert newest[0]["id"] < newest[1]["id"]
        deadline = time.monotonic() + 30
        while runner.job("quick")["state"] != "finished" and time.monotonic() < deadline:
            runner.round()
            time.sleep(0.1)
        assert runner.job("quick")["state"] == "finished"
        assert runner.events("quick", 0, last=1)[0]["kind"] == "finished"
    finally:
        runner.shutdown()


@pytest.mark.slow
def test_dashboard_follows_jobs_live(browser: Any, service: Service, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: errors.append(f"console: {msg.text}")
            if msg.type == "error" else None)

    for path in ("/", "/dashboard"):  # both addresses serve the page, with its script and style
        assert "/static/dashboard.js" in service.http.get(service.url + path).text
    for asset in ("dashboard.js", "dashboard.css"):
        assert service.http.get(f"{service.url}/static/{asset}").status_code == 200

    assert service.submit(job_yaml("wide", epochs=4, sleep=0.1, max_replicas=2)).status_code \
        == 201
    assert service.submit(job_yaml("narrow", epochs=2, sleep=0.1, max_replicas=1)).status_code \
        == 201
    page.goto(f"{service.url}/?interval=500")
    page.evaluate("window.__loadedOnce = true")  # a reload would drop this marker

    # The table lists both jobs with their states from the API.
    row = page.locator('#jobs tr[data-job="wide"]')
    row.wait_for(timeout=WAIT_MS)
    assert page.locator('#jobs tr[data-job="narrow"]').count() == 1
    assert row.locator(".state").inner_text() in ("pending", "restarting", "running")

    # Once "wide" trains, the grid colours the devices it holds on node 0 (3 CPU slots).
    held = page.locator('#nodes .device.held[data-job="wide"]')
    held.first.wait_for(timeout=WAIT_MS)
    assert page.locator("#nodes .device").count() == 3
    assert page.locator('#nodes .node-head .type').first.inner_text() == "cpu"
    assert "wide" in (held.first.get_attribute("title") or "")
    assert row.get_attribute("data-state") in ("restarting", "running")
    # The table's allocation and the grid agree: as many coloured devices as replicas.
    page.wait_for_function(GRID_MATCHES_TABLE, arg="wide", timeout=WAIT_MS)

    # Clicking the job opens its detail: allocation history and the scheduler's reason.
    row.click()
    detail = page.locator('#detail[data-job="wide"]')
    detail.wait_for(timeout=WAIT_MS)
    history = page.locator("#history tbody tr")
    assert history.count() >= 1
    assert "× cpu" in history.last.inner_text()  # oldest entry last: the first placement
    why = page.locator("#detail-why")
    page.wait_for_function(
        "() => document.querySelector('#detail-why').textContent.includes('pollux granted')",
        timeout=WAIT_MS,
    )
    api_reason = service.job("wide")["decision"]["reason"]
    assert api_reason.startswith("pollux granted"), api_reason
    assert "pollux granted" in why.inner_text()

    page.wait_for_function(  # some progress shows (it stays at 100% once finished)
        "() => !document.querySelector('#jobs tr[data-job=\"wide\"] .bar b')"
        ".textContent.startsWith('0%')", timeout=WAIT_MS)
    screenshot = tmp_path / "dashboard.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    if os.environ.get("SHOAL_DASHBOARD_SCREENSHOT"):
        shutil.copyfile(screenshot, os.environ["SHOAL_DASHBOARD_SCREENSHOT"])

    # Both jobs finish; the page follows without a reload: states, grid, detail and events.
    def both_finished() -> bool:
        return all(j["state"] in ("finished", "failed") for j in service.jobs())

    wait_until(both_finished, 90, "both jobs to finish", service.diagnostics)
    assert {j["name"]: j["state"] for j in service.jobs()} == {
        "wide": "finished", "narrow": "finished"}
    for name in ("wide", "narrow"):
        page.wait_for_selector(f'#jobs tr[data-job="{name}"][data-state="finished"]',
                               timeout=WAIT_MS)
    assert page.evaluate("window.__loadedOnce") is True
    page.wait_for_function(  # the grid frees the devices (cluster and jobs are two requests)
        "() => document.querySelectorAll('#nodes .device.held').length === 0", timeout=WAIT_MS)
    assert page.locator("#nodes .device").count() == 3
    assert "100%" in row.locator(".bar").inner_text()
    page.wait_for_selector('#events li[data-kind="finished"][data-job="wide"]', timeout=WAIT_MS)
    page.wait_for_selector('#detail .events li[data-kind="finished"]', timeout=WAIT_MS)
    assert page.locator("#detail-name .state").inner_text() == "finished"
    # What one restart cost the job, measured from its runs (the API's restart_seconds).
    cost = next(j["restart_seconds"] for j in service.jobs() if j["name"] == "wide")
    assert page.locator("#detail-restart").inner_text() == f"{cost:.1f} s per restart"
    # How long it held no devices (the API's queued_seconds; fixed once the job finished).
    queued = next(j["queued_seconds"] for j in service.jobs() if j["name"] == "wide")
    assert page.locator("#detail-queued").inner_text() == f"{queued:.1f} s without devices"
    assert int(page.locator("#status").get_attribute("data-polls") or 0) > 2
    assert not errors, errors



STREAM_YAML = """name: feed
kind: stream
stream: {input_rate: 40, throughput: {cpu: 80, gpu: 80}, max_lag_s: 5, max_replicas: 1}
"""


@pytest.mark.realtime
@pytest.mark.slow
def test_dashboard_shows_a_streams_rate_and_lag_instead_of_progress(
        browser: Any, tmp_path: Path) -> None:
    with running_service(tmp_path / "home", slots=1, interval=0.5) as service:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
        assert service.submit(STREAM_YAML).status_code == 201
        page.goto(f"{service.url}/?interval=500")
        line = page.locator('#jobs tr[data-job="feed"] .service-line')
        line.wait_for(timeout=WAIT_MS)
        page.wait_for_function(  # measured: a rate near the declared 40 samples/s and a lag
            "() => /^(3\\d|4\\d)\\.\\d samples\\/s · lag \\d+\\.\\d s$/.test(document"
            ".querySelector('#jobs tr[data-job=\"feed\"] .service-line').textContent)",
            timeout=WAIT_MS)
        assert page.locator('#jobs tr[data-job="feed"] .bar').count() == 0
        page.locator('#jobs tr[data-job="feed"]').click()
        facts = page.locator("#detail-service")
        facts.wait_for(timeout=WAIT_MS)
        text = facts.inner_text()
        for label in ("input rate", "processed", "lag", "lag bound"):
            assert label in text, text
        assert "5.00 s" in text  # the bound
        service.http.post(f"{service.url}/api/jobs/feed/cancel").raise_for_status()
        assert not errors, errors
