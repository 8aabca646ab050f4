"""Serve and stream jobs through the scheduler service (API, CLI, restart) and in run reports."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from click.testing import CliRunner

from shoal.backends.local.devices import DevicePool
from shoal.backends.local.job import RunSettings
from shoal.backends.local.services import announced_host
from shoal.backends.sim.run import simulate
from shoal.cli.main import cli
from shoal.metrics.report import summarize
from shoal.policy import make_policy
from shoal.serve.wire import example_tokens
from shoal.spec import JobSpec, parse_cluster, parse_job
from tests.service.helpers import REPO, Service, running_service, wait_until

# The built-in model; one replica at most, planned at 50 ms per request (either device type).
SERVE_YAML = """name: web
kind: serve
serve:
  model: tiny
  slo_s: 30.0
  latency: {cpu: [0.05], gpu: [0.05]}
  max_replicas: 1
"""


# Every 127.x.y.z address reaches this machine, but a socket bound to 127.0.0.1 takes only
# connections made to 127.0.0.1: this one tells "every interface" from "loopback only".
OTHER_LOOPBACK = "127.0.0.5"


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _service_of(service: Service, name: str) -> dict:
    return service.job(name).get("service") or {}


def test_serve_job_runs_through_the_service_answers_http_and_reports_its_slo(
        tmp_path: Path) -> None:
    with running_service(tmp_path / "home", slots=2, interval=0.5) as service:
        # Validation names the field; nothing is admitted.
        for text, field in [
            ("name: s1\nkind: stream\nstream: {input_rate: 5, throughput: {t4: 9}, "
             "max_lag_s: 5}\n", "stream.throughput"),
            (SERVE_YAML.replace("web", "s2").replace("model: tiny", "model: opt-6.7b"),
             "serve.model"),
            (SERVE_YAML.replace("web", "s3") + 'command: ["python", "serve.py"]\n', "command"),
            (SERVE_YAML.replace("web", "s4").replace("cpu: [0.05], gpu: [0.05]", "t4: [0.05]"),
             "serve.latency"),
        ]:
            response = service.submit(text)
            assert response.status_code == 422, (field, response.text)
            assert response.json()["detail"]["field"] == field
        assert service.jobs() == []

        # A serve job needs no command: the service starts a model server and its router.
        assert service.submit(SERVE_YAML).status_code == 201
        wait_until(lambda: _service_of(service, "web").get("url") is not None, 90,
                   "the serve job's router", service.diagnostics)
        url = _service_of(service, "web")["url"]
        assert url.startswith("http://127.0.0.1:")
        with pytest.raises(httpx.ConnectError):  # listens on loopback only, like the service
            httpx.get(url.replace("127.0.0.1", OTHER_LOOPBACK) + "/stats", timeout=5.0)
        with httpx.Client(timeout=30.0) as client:
            for i in range(5):
                answer = client.post(f"{url}/infer", json={"tokens": example_tokens(i)})
                assert answer.status_code == 200, answer.text
                assert 0 <= answer.json()["label"] < 10
            # A deadline no replica can meet: rejected by admission, a miss for the SLO.
            late = client.post(f"{url}/infer", json={"tokens": example_tokens(9),
                                                     "slo_s": 1e-6})
            assert late.status_code == 503
        wait_until(lambda: _service_of(service, "web").get("requests") == 6, 30,
                   "the router's counts in the job's record", service.diagnostics)
        job = service.job("web")
        metrics = job["service"]
        assert job["kind"] == "serve" and job["state"] == "running" and job["jct"] is None
        assert metrics["replicas"] == 1 and job["allocation"]["replicas"] == 1
        assert metrics["slo_attainment"] == pytest.approx(5 / 6)
        assert 0 < metrics["p99_latency_s"] < 30.0
        assert metrics["arrival_rate"] is not None

        runner = CliRunner(env={"COLUMNS": "200"})
        home = ["--home", str(service.home)]
        listed = runner.invoke(cli, ["ls", *home])
        assert listed.exit_code == 0, listed.output
        assert "SLO 83.3%" in listed.output and "serve" in listed.output
        shown = runner.invoke(cli, ["show", "web", *home])
        assert shown.exit_code == 0, shown.output
        for text in (url, "83.33%", "requests answered", "p99 latency"):
            assert text in shown.output, shown.output

        # A killed service leaves its servers behind; the next one stops them and starts the
        # job afresh behind a new router.
        old = list(metrics["pids"])
        assert len(old) == 2 and all(_alive(p) for p in old)
        service.kill()
        service.start()
        wait_until(lambda: not any(_alive(p) for p in old), 30, "the old servers to stop",
                   service.diagnostics)
        wait_until(lambda: _service_of(service, "web").get("url") is not None, 90,
                   "the restarted serve job", service.diagnostics)
        url = _service_of(service, "web")["url"]
        assert httpx.post(f"{url}/infer", json={"tokens": example_tokens(1)},
                          timeout=30.0).status_code == 200

        pids = _service_of(service, "web")["pids"]
        cancelled = service.http.post(f"{service.url}/api/jobs/web/cancel")
        assert cancelled.status_code == 200
        assert not any(_alive(p) for p in pids)
        assert service.job("web")["service"]["url"] is None


def test_run_report_keeps_services_out_of_job_completion_times(profiles) -> None:
    cluster = parse_cluster({
        "name": "four-t4", "device_types": [{"name": "t4", "memory_gb": 16}],
        "nodes": [{"device_type": "t4", "devices_per_node": 4, "count": 1}]})
    serve = parse_job({"name": "chat", "kind": "serve", "serve": {
        "model": "m", "slo_s": 1.0, "latency": {"t4": [0.15, 0.2, 0.25, 0.3]},
        "arrival": {"rate": 20.0}, "duration_s": 900}})
    stream = parse_job({"name": "clicks", "kind": "stream", "stream": {
        "input_rate": 100, "throughput": {"t4": 200}, "max_lag_s": 30, "duration_s": 900}})
    train = JobSpec(name="train", application="cifar10", num_replicas=2, target_epochs=2)
    result = simulate([serve, stream, train], make_policy("pollux"), cluster, profiles,
                      interval=30, max_time=3 * 3600)
    report = summarize(result)
    assert [j["name"] for j in report["jobs"]] == ["train"]
    summary = report["summary"]
    assert summary["jobs"] == 1 and summary["services"] == 2
    train_jct = report["jobs"][0]["jct_s"]
    assert train_jct is not None and summary["avg_jct_s"] == pytest.approx(train_jct)
    services = {s["name"]: s for s in report["services"]}
    chat, clicks = services["chat"], services["clicks"]
    assert chat["kind"] == "serve" and chat["requests"] == result.services["chat"]["requests"]
    assert chat["slo_attainment"] == result.services["chat"]["slo_attainment"]
    assert 0 < chat["p99_latency_s"] < 1.0
    assert chat["peak_devices"] >= 2  # 20 req/s / (13.3 req/s * 0.8) per replica
    assert clicks["kind"] == "stream" and clicks["max_lag_s"] == result.services["clicks"][
        "max_lag_s"]
    # One device keeps up (200 >= 1.2 * 100); a second drains the first interval's backlog.
    assert clicks["peak_devices"] == max(h["replicas"] for h in result.services["clicks"][
        "history"]) == 2
    assert 1 <= clicks["mean_devices"] < 2
    assert summary["service_requests"] == chat["requests"]
    assert summary["service_slo_attainment"] == pytest.approx(chat["slo_attainment"])
    assert summary["service_device_hours"] == pytest.approx(
        (chat["device_seconds"] + clicks["device_seconds"]) / 3600)


def test_a_service_shutdown_does_not_start_serve_replicas_again(tmp_path: Path) -> None:
    from shoal.backends.local.backend import LocalBackend
    from shoal.backends.local.devices import DevicePool
    from shoal.backends.local.job import RunSettings
    from shoal.core.types import Allocation
    from shoal.spec import load_job_yaml

    backend = LocalBackend(RunSettings(home=tmp_path, pool=DevicePool("cpu", 2, 1)))
    backend.admit(load_job_yaml(SERVE_YAML))
    service = backend.services["web"]
    service.target = Allocation("cpu", (0,))  # granted, no process started yet
    try:
        backend.stop_all()
        backend.observe()  # the shutdown's last look at the jobs
        assert service.replicas == [] and service.router is None
    finally:
        service.stop()


def test_a_service_on_every_interface_starts_routers_there_too(tmp_path: Path) -> None:
    with running_service(tmp_path / "home", slots=1, interval=0.5, host="0.0.0.0") as service:
        assert service.submit(SERVE_YAML).status_code == 201
        wait_until(lambda: _service_of(service, "web").get("url") is not None, 90,
                   "the serve job's router", service.diagnostics)
        url = urlsplit(_service_of(service, "web")["url"])
        assert url.hostname == announced_host(RunSettings(
            Path(), DevicePool("cpu", 1, 1), router_host="0.0.0.0"))
        answer = httpx.post(f"http://{OTHER_LOOPBACK}:{url.port}/infer",
                            json={"tokens": example_tokens(0)}, timeout=30.0)
        assert answer.status_code == 200, answer.text
        service.http.post(f"{service.url}/api/jobs/web/cancel").raise_for_status()


# 40 samples/s, then 120 from 15 s after submission; one worker processes 80/s, so the step
# needs two (1.2 x 120 = 144 > 80).
STREAM_YAML = """name: clicks
kind: stream
stream:
  input_rate: 40
  steps: [{at_s: 15, rate: 120}]
  throughput: {cpu: 80, gpu: 80}
  max_lag_s: 5
  max_replicas: 2
  startup_s: 1
  downscale_delay_s: 5
"""


@pytest.mark.realtime
def test_a_stream_job_runs_workers_that_keep_up_as_its_input_rate_steps_up(
        tmp_path: Path) -> None:
    with running_service(tmp_path / "home", slots=2, interval=0.5) as service:
        assert service.submit(STREAM_YAML).status_code == 201
        wait_until(lambda: _service_of(service, "clicks").get("processed"), 60,
                   "the first samples processed", service.diagnostics)
        first = _service_of(service, "clicks")
        assert first["kind"] == "stream" and first["replicas"] == 1, first
        assert first["lag_bound_s"] == 5
        wait_until(lambda: _service_of(service, "clicks").get("replicas") == 2, 60,
                   "a second worker for the higher rate", service.diagnostics)
        # Two workers drain what piled up while the second started, then keep up.
        wait_until(lambda: (_service_of(service, "clicks").get("input_rate") or 0) > 100
                   and _service_of(service, "clicks")["lag_s"] < 1.0, 60,
                   "the lag back under a second at the higher rate", service.diagnostics)
        stats = httpx.get(f"{_service_of(service, 'clicks')['url']}/stats", timeout=5.0).json()
        assert stats["processed"] > 0.9 * stats["arrived"] > 0, stats
        assert _service_of(service, "clicks")["max_lag_s"] < 5.0
        job = service.job("clicks")
        assert job["state"] == "running" and job["allocation"]["replicas"] == 2
        workers = sorted(p.name for p in (service.home / "logs" / "clicks").glob("worker-*"))
        assert len(workers) >= 2, workers  # one per device granted (more after a shrink)
        # The source dies: a new one resumes from the count last read, with new workers.
        before = _service_of(service, "clicks")
        os.kill(before["pids"][0], signal.SIGKILL)
        wait_until(lambda: (_service_of(service, "clicks").get("url") or before["url"])
                   != before["url"] and _service_of(service, "clicks")["replicas"] == 2
                   and _service_of(service, "clicks")["processed"] > before["processed"], 60,
                   "a new source and workers", service.diagnostics)
        # What arrived while no source ran is drained by the new workers.
        wait_until(lambda: (_service_of(service, "clicks").get("lag_s") or 99.0) < 5.0, 60,
                   "the new workers catching up", service.diagnostics)
        # A killed service: the next one stops the old processes and resumes the stream at the
        # count it had stored (started over, it would hand out every sample since submission).
        before = _service_of(service, "clicks")
        service.kill()
        service.start()
        wait_until(lambda: not any(_alive(p) for p in before["pids"]), 30,
                   "the old processes to stop", service.diagnostics)
        wait_until(lambda: (_service_of(service, "clicks").get("url") or before["url"])
                   != before["url"], 60, "the restarted stream's source", service.diagnostics)
        resumed = httpx.get(f"{_service_of(service, 'clicks')['url']}/stats", timeout=5.0).json()
        assert resumed["processed"] >= before["processed"] > 1000, (resumed, before)
        wait_until(lambda: _service_of(service, "clicks").get("replicas") == 2
                   and (_service_of(service, "clicks").get("lag_s") or 99.0) < 2.0, 60,
                   "the restarted stream keeping up again", service.diagnostics)
        pids = _service_of(service, "clicks")["pids"]
        assert len(pids) == 3  # the source and two workers
        service.http.post(f"{service.url}/api/jobs/clicks/cancel").raise_for_status()
        assert service.job("clicks")["state"] == "failed"  # cancelled by its user
        assert not any(_alive(p) for p in pids)
        assert _service_of(service, "clicks")["url"] is None


SLOW_STREAM_YAML = """name: slow
kind: stream
stream:
  input_rate: 40
  throughput: {cpu: 80, gpu: 80}
  max_lag_s: 5
  max_replicas: 2
  startup_s: 1
  downscale_delay_s: 5
"""


@pytest.mark.realtime
def test_a_stream_job_on_devices_slower_than_declared_is_sized_by_their_measured_speed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Workers pace at 0.4 x 80 = 32 samples/s: one covers 40/s as declared, not as measured.
    monkeypatch.setenv("SHOAL_STREAM_WORKER_SPEED", "0.4")
    with running_service(tmp_path / "home", slots=2, interval=0.5) as service:
        assert service.submit(SLOW_STREAM_YAML).status_code == 201
        wait_until(lambda: _service_of(service, "slow").get("device_speed"), 60,
                   "a measured device speed", service.diagnostics)
        measured = _service_of(service, "slow")
        assert measured["device_type"] == service.job("slow")["allocation"]["device_type"]
        assert 24.0 < measured["device_speed"] < 34.0, measured
        shown = CliRunner().invoke(cli, ["show", "slow", "--home", str(service.home)])
        assert shown.exit_code == 0, shown.output
        assert f"measured on {measured['device_type']}" in shown.output
        wait_until(lambda: _service_of(service, "slow").get("replicas") == 2
                   and _service_of(service, "slow")["lag_s"] < 1.0, 60,
                   "two workers keeping up", service.diagnostics)
        # Caught up, the declared speed would need one worker again after the downscale delay
        # (48 samples/s < 80); at the measured one it keeps two.
        time.sleep(8.0)
        after = _service_of(service, "slow")
        assert after["replicas"] == 2 and service.job("slow")["allocation"]["replicas"] == 2
        assert after["lag_s"] < 5.0, after


@pytest.mark.parametrize(("name", "kind"), [("web", "serve"), ("clicks", "stream")])
def test_the_service_examples_are_jobs_this_machine_accepts(name: str, kind: str,
                                                            tmp_path: Path) -> None:
    from shoal.backends.local.backend import LocalBackend
    from shoal.spec import load_job_yaml

    path = REPO / "examples" / "services" / f"{name}.yaml"
    spec = load_job_yaml(path.read_text(), str(path))
    assert spec.name == name and spec.kind == kind and not spec.command
    backend = LocalBackend(RunSettings(home=tmp_path, pool=DevicePool("cpu", 2, 1)))
    limits = backend.admit(spec)  # checks model, profiles and types; starts nothing
    assert limits.max_replicas == 2 and backend.services[name].router is None
