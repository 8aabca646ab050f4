"""Job kinds serve and stream: spec validation, demand before training in the core, the
simulator's services, and a serve job run by the local backend as real processes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from shoal.backends.sim.run import simulate
from shoal.core.demand import ServiceDemand
from shoal.core.types import (
    Allocation,
    ClusterState,
    JobLimits,
    JobState,
    JobStatus,
    JobView,
    ModelHints,
)
from shoal.policy import make_policy
from shoal.spec import JobSpec, SpecError, load_job_yaml, parse_cluster, parse_job
from shoal.spec.cluster import NodeInfo

DOC_EXAMPLE = """
name: chat
kind: serve
tenant: product
serve:
  model: opt-6.7b
  slo_s: 1.0
  arrival: {rate: 20, cv: 2, steps: [{at_s: 600, rate: 60}]}
  latency: {v100: [0.12, 0.15, 0.19, 0.24]}
  max_replicas: 8
  duration_s: 3600
"""

LATENCY = {"t4": [0.15, 0.2, 0.25, 0.3]}  # seconds per batch of 1..4
EIGHT_T4 = parse_cluster({
    "name": "eight-t4",
    "device_types": [{"name": "t4", "memory_gb": 16}],
    "nodes": [{"device_type": "t4", "devices_per_node": 4, "count": 2}],
})


def _serve(name: str = "chat", **serve) -> JobSpec:
    section = {"model": "opt-6.7b", "slo_s": 1.0, "latency": LATENCY, **serve}
    return parse_job({"name": name, "kind": "serve", "serve": section})


def _error(text: str) -> SpecError:
    with pytest.raises(SpecError) as err:
        load_job_yaml(text)
    return err.value


# ----- specs -----
def test_serve_and_stream_specs_parse():
    job = load_job_yaml(DOC_EXAMPLE)
    assert job.kind == "serve" and job.application == "opt-6.7b"
    assert job.serve is not None and job.serve.latency == {
        "v100": {1: 0.12, 2: 0.15, 3: 0.19, 4: 0.24}}
    assert job.serve.arrival is not None and job.serve.arrival.rate_at(700) == 60
    stream = load_job_yaml("name: clicks\nkind: stream\nstream: {input_rate: 2000, "
                           "throughput: {t4: 450}, max_lag_s: 30}\n")
    assert stream.kind == "stream" and stream.stream is not None
    assert stream.stream.devices_for("t4", 2000) == 6  # 450 * 6 >= 1.2 * 2000 > 450 * 5
    assert load_job_yaml("name: a\napplication: cifar10\n").kind == "train"
    for spec in (job, stream):  # what a store saves reloads to the same spec
        assert JobSpec.model_validate(json.loads(json.dumps(spec.model_dump(mode="json")))) == spec


def test_latency_profile_from_file(tmp_path):
    path = tmp_path / "profile.csv"
    path.write_text("device_type,batch_size,latency_s\nt4,1,0.1\nt4,4,0.25\nv100,1,0.05\n")
    job = _serve(latency=None, latency_file=str(path))
    assert job.serve is not None and job.serve.latency == {"t4": {1: 0.1, 4: 0.25},
                                                           "v100": {1: 0.05}}
    assert job.serve.latency_s("t4", 2) == pytest.approx(0.15)  # linear between sizes


@pytest.mark.parametrize(("text", "field", "fix"), [
    ("name: s\nkind: serve\n", "serve", "needs a serve section"),
    ("name: s\nkind: stream\n", "stream", "needs a stream section"),
    ("name: s\napplication: x\nserve: {model: m, slo_s: 1, latency: {t4: [0.1]}}\n",
     "serve", "set kind: serve"),
    ("name: s\nkind: serve\nserve: {model: m, slo_s: 1}\n", "serve.latency", "latency_file"),
    ("name: s\nkind: serve\nserve: {model: m, slo_s: 1, latency: {t4: [0.2, 0.1]}}\n",
     "serve.latency.t4", "must not decrease"),
    ("name: s\nkind: serve\nserve: {model: m, slo_s: 1, max_batch: 8, latency: {t4: [0.1]}}\n",
     "serve.max_batch", "lower max_batch"),
    ("name: s\nkind: serve\nserve: {model: m, slo_s: 0, latency: {t4: [0.1]}}\n",
     "serve.slo_s", "greater than 0"),
    ("name: s\nkind: serve\nserve: {model: m, slo_s: 1, latency: {t4: [0.1]}, arrival: "
     "{rate: 3, trace: code}}\n", "serve.arrival", "not both"),
    ("name: s\nkind: serve\nserve: {model: m, slo_s: 1, latency: {t4: [0.1]}, arrival: "
     "{trace: code, cv: 4}}\n", "serve.arrival.cv", "rate_scale"),
    ("name: s\nkind: serve\nmax_replicas: 3\nserve: {model: m, slo_s: 1, latency: {t4: [1]}}\n",
     "max_replicas", "serve.max_replicas"),
    ("name: s\nkind: serve\ntarget_epochs: 3\nserve: {model: m, slo_s: 1, latency: {t4: [1]}}\n",
     "target_epochs", "training jobs only"),
    ("name: s\nkind: serve\nmodel: llama-7b\nserve: {model: m, slo_s: 1, latency: {t4: [1]}}\n",
     "model", "serve.model"),
    ("name: s\nkind: serve\ndevice_types: [v100]\nserve: {model: m, slo_s: 1, latency: "
     "{t4: [1]}}\n", "device_types", "add one"),
    ("name: s\nkind: stream\nstream: {input_rate: 10, max_lag_s: 5}\n", "stream.throughput",
     "required"),
    ("name: s\nkind: stream\nstream: {input_rate: 10, throughput: {t4: 4}, max_lag_s: 5, "
     "min_replicas: 9, max_replicas: 2}\n", "stream.min_replicas", "raise max_replicas"),
])
def test_bad_service_specs_name_the_field_and_the_fix(text, field, fix):
    error = _error(text)
    assert error.field == field
    assert fix in str(error)


def test_replicas_from_the_slo():
    serve = _serve().serve
    assert serve is not None
    # 2 L(b) <= 1 s up to b = 4: a replica runs 4 requests per 0.3 s.
    assert serve.replica_capacity("t4") == pytest.approx(4 / 0.3)
    assert serve.replicas_for("t4", 40.0) == 4  # 40 / (13.3 * 0.8) = 3.75
    assert serve.replicas_for("t4", 5.0) == 1
    assert serve.replicas_for("t4", 0.0) == 1  # min_replicas
    assert serve.replicas_for("t4", 1000.0) == 16  # max_replicas
    tight = _serve(slo_s=0.25).serve  # no batching keeps 2 L(b) <= SLO; single requests do
    assert tight is not None and tight.replica_capacity("t4") == pytest.approx(1 / 0.15)
    assert _serve(slo_s=0.1).serve.replicas_for("t4", 1.0) is None  # type: ignore[union-attr]


# ----- the core's service pass -----
def _view(spec: JobSpec, allocation: Allocation | None, submit: float = 0.0) -> JobView:
    limits = JobLimits(1, 1, 1, 1, 16)
    return JobView(spec.name, spec, JobState.RUNNING if allocation else JobState.PENDING,
                   submit, 0.0, 0.0, 0, allocation, ModelHints(), limits)


def test_service_takes_free_devices_then_displaces_the_smallest_training_job_that_frees_enough():
    cluster = ClusterState((NodeInfo(0, "t4", 4), NodeInfo(1, "t4", 4)))
    big = _view(JobSpec(name="big", application="cifar10"), Allocation("t4", (0, 0, 0, 0)))
    small = _view(JobSpec(name="small", application="cifar10"), Allocation("t4", (1, 1)))
    serve = _view(_serve(arrival={"rate": 40.0}), None, submit=1.0)  # needs 4 replicas
    demand = ServiceDemand()
    plan = demand.plan([big, small, serve], cluster, now=10.0)
    grant = plan.grants["chat"]
    assert grant.replicas == 4 and grant.nodes == (1, 1, 1, 1)
    assert plan.displaced == {"small"}
    assert [n.capacity for n in plan.cluster.nodes] == [4]  # the policy decides over node 0
    assert {v.name: v.allocation for v in plan.training}["small"] is None
    assert demand.kept([big, small, serve]) == {"big": big.allocation}

    # The measured rate falls: the service keeps its replicas for downscale_delay_s, then
    # shrinks and hands the devices back.
    held = _view(serve.spec, Allocation("t4", grant.nodes), submit=1.0)
    demand.observe(held.spec, JobStatus("chat", extra={"arrival_rate": 5.0}))
    assert demand.plan([big, held], cluster, now=20.0).grants["chat"].replicas == 4
    assert demand.plan([big, held], cluster, now=79.0).grants["chat"].replicas == 4
    later = demand.plan([big, held], cluster, now=81.0)
    assert later.grants["chat"].replicas == 1
    assert sum(n.capacity for n in later.cluster.nodes) == 7


# ----- the simulator -----
def _allocated(record, t: float) -> int:
    """Devices ``record`` held at time ``t`` (its allocation history is piecewise constant)."""
    if record.finish_time is not None and t >= record.finish_time:
        return 0
    held = 0
    for when, alloc in record.history:
        if when <= t:
            held = alloc.num_replicas if alloc is not None else 0
    return held


def test_serve_gets_its_demand_first_and_training_shrinks_and_grows_back(profiles):
    serve = _serve(arrival={"rate": 20.0, "steps": [{"at_s": 600, "rate": 60.0},
                                                    {"at_s": 1200, "rate": 20.0}]},
                   duration_s=1800, cold_start_s=5)
    training = [JobSpec(name=f"train-{i}", application="imagenet", num_replicas=4)
                for i in range(2)]
    result = simulate([serve, *training], make_policy("pollux"), EIGHT_T4, profiles,
                      interval=30, max_time=1800)
    records = {r.name: r for r in result.records}
    history = result.services["chat"]["history"]
    spec = serve.serve
    assert spec is not None
    # First round: the replicas the SLO needs at the rate measured over the first interval.
    first_time, first = records["chat"].history[0]
    assert first_time == 30.0 and first is not None
    assert first.num_replicas == spec.replicas_for("t4", history[0]["arrival_rate"]) >= 2
    times = sorted({t for r in result.records for t, _ in r.history} | {30.0 * k for k in
                                                                       range(1, 61)})
    for t in times:  # never over-committed
        assert sum(_allocated(r, t) for r in result.records) <= 8

    def training_at(t: float) -> int:
        return sum(_allocated(records[j.name], t) for j in training)

    assert _allocated(records["chat"], 900) == spec.replicas_for("t4", 60.0) == 6
    before, during, after = training_at(570), training_at(900), training_at(1770)
    assert before == 6 and during == 2 and after == 6
    assert records["chat"].state == JobState.FINISHED
    # Once scaled up, every request meets its SLO.
    settled = [h for h in history if 700 <= h["start"] < 1200]
    assert settled and all(h["slo_attainment"] > 0.99 for h in settled)
    assert result.services["chat"]["slo_attainment"] > 0.9


def test_stream_grows_on_a_rate_step_and_its_lag_stays_bounded(profiles):
    def stream(name: str, max_replicas: int = 64) -> JobSpec:
        return parse_job({"name": name, "kind": "stream", "stream": {
            "input_rate": 200, "steps": [{"at_s": 600, "rate": 800}],
            "throughput": {"t4": 100}, "scaling": 0.95, "max_lag_s": 60,
            "duration_s": 1200, "max_replicas": max_replicas}})

    cluster = parse_cluster({
        "name": "sixteen-t4", "device_types": [{"name": "t4", "memory_gb": 16}],
        "nodes": [{"device_type": "t4", "devices_per_node": 4, "count": 4}]})
    jobs = [stream("clicks"), stream("capped", max_replicas=3),
            JobSpec(name="train", application="cifar10", num_replicas=4)]
    result = simulate(jobs, make_policy("pollux"), cluster, profiles, interval=30,
                      max_time=1200)
    records = {r.name: r for r in result.records}
    assert _allocated(records["clicks"], 590) == 3  # 100 * 3**0.95 >= 1.2 * 200
    assert _allocated(records["clicks"], 900) >= 11  # 100 * 11**0.95 >= 1.2 * 800
    clicks, capped = result.services["clicks"], result.services["capped"]
    assert clicks["max_lag_s"] < 60 and clicks["final_lag_s"] == 0.0
    # The same stream held at 3 devices falls behind without bound.
    assert capped["final_lag_s"] > 5 * 60
    lags = [h["lag_s"] for h in capped["history"] if h["start"] >= 600]
    assert lags == sorted(lags)


def test_trace_arrivals_and_simulator_admission_errors(profiles, tmp_path):
    trace = tmp_path / "requests.csv"
    rows = [f"{i * 0.05:.2f},{'a' if i % 3 else 'b'}" for i in range(600)]
    trace.write_text("arrival_s,model\n" + "\n".join(rows) + "\n")
    served = _serve(model="b", arrival={"trace": str(trace), "model_column": "model"})
    missing = _serve(name="no-arrivals")
    endless = _serve(name="endless", arrival={"rate": 3.0})
    result = simulate([served, missing, endless], make_policy("fifo"), EIGHT_T4, profiles,
                      interval=10, max_time=100)
    records = {r.name: r for r in result.records}
    assert result.services["chat"]["requests"] == 200  # the rows of model b
    assert records["chat"].state == JobState.FINISHED
    assert "serve.arrival" in (records["no-arrivals"].failure or "")
    assert "serve.duration_s" in (records["endless"].failure or "")


# ----- the local backend -----
def test_router_takes_a_new_replica_set_behind_the_same_url():
    from fastapi.testclient import TestClient

    from shoal.serve.router import create_router_app

    def replicas(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"from": request.url.host})

    app = create_router_app(["http://a:1"], "round-robin",
                            transport=httpx.MockTransport(replicas))
    with TestClient(app) as client:
        assert client.post("/infer", json={}).json() == {"from": "a"}
        assert client.put("/replicas", json={"replicas": ["http://b:1", "http://c:1/"]}
                          ).json() == {"replicas": ["http://b:1", "http://c:1"]}
        hosts = [client.post("/infer", json={}).json()["from"] for _ in range(2)]
        bad = client.put("/replicas", json={"replicas": ["ftp://x"]})
        empty = client.put("/replicas", json={"replicas": []})
        stats = client.get("/stats").json()
    assert sorted(hosts) == ["b", "c"]
    assert bad.status_code == 422 and "replicas" in bad.text
    assert empty.status_code == 422
    assert stats["total_forwarded"] == 3 and stats["forwarded"] == [1, 1]


def test_local_backend_runs_a_serve_job_that_answers_http_and_follows_its_demand(tmp_path,
                                                                                 monkeypatch):
    from shoal.backends.local.backend import LocalBackend
    from shoal.backends.local.devices import DevicePool
    from shoal.backends.local.job import RunSettings
    from shoal.core.scheduler import Scheduler
    from shoal.serve.wire import example_tokens

    monkeypatch.setattr("shoal.backends.local.services.RATE_WINDOW_S", 3.0)  # rate over 3 s
    backend = LocalBackend(RunSettings(home=Path(tmp_path), pool=DevicePool("cpu", 2, 1)))
    scheduler = Scheduler(make_policy("fifo"), backend)
    # Planned at 1 s per request with a 2.5 s SLO: one replica covers 0.8 requests/s.
    spec = parse_job({"name": "web", "kind": "serve", "serve": {
        "model": "tiny", "slo_s": 2.5, "latency": {"cpu": [1.0]}, "max_replicas": 2,
        "downscale_delay_s": 1.0}})
    stop_traffic = threading.Event()

    def traffic(url: str) -> None:
        with httpx.Client(timeout=30.0) as client:
            while not stop_traffic.wait(0.1):
                client.post(f"{url}/infer", json={"tokens": example_tokens(1)})

    def until(condition, what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            scheduler.round()
            time.sleep(0.2)

    def routed() -> int:
        return len(httpx.get(f"{url}/health", timeout=5.0).json()["replicas"])

    sender = None
    try:
        record = scheduler.submit(spec)
        until(lambda: backend.service_url("web") is not None, "the first replica")
        url = backend.service_url("web")
        assert url is not None and url.startswith("http://127.0.0.1:")
        answer = httpx.post(f"{url}/infer", json={"tokens": example_tokens(0), "slo_s": 5.0},
                            timeout=30.0)
        assert answer.status_code == 200
        assert 0 <= answer.json()["label"] < 10
        assert record.state == JobState.RUNNING and record.allocation is not None
        assert record.allocation.num_replicas == 1
        # ~10 requests/s > 0.8: the core grants a second device, a second server joins the
        # router behind the same URL.
        sender = threading.Thread(target=traffic, args=(url,), daemon=True)
        sender.start()
        until(lambda: routed() == 2, "a second replica")
        assert record.allocation.num_replicas == 2
        assert backend.service_url("web") == url
        # Traffic stops: back to one replica.
        stop_traffic.set()
        sender.join(30)
        until(lambda: routed() == 1, "the service to shrink back")
        assert httpx.post(f"{url}/infer", json={"tokens": example_tokens(2)},
                          timeout=30.0).status_code == 200
        assert len(backend.services["web"].replicas) == 1
    finally:
        stop_traffic.set()
        if sender is not None:
            sender.join(30)
        backend.stop_all()
    assert backend.services["web"].replicas == [] and backend.services["web"].router is None


@pytest.mark.parametrize(("offered", "extra", "field"), [
    (["cpu", "fast"], "", None),  # a profiled type among several offered
    (["fast", "slow"], "", "serve.latency"),  # no offered type is profiled
    (["gpu"], "device_types: [cpu]\n", "device_types"),
    (["cpu", "fast"], "device_types: [gpu]\n", "device_types"),  # none the job allows
    (["cpu"], "", None),
])
def test_a_backend_runs_a_serve_job_with_a_profile_for_an_offered_type(offered, extra, field):
    from shoal.backends.local.services import check_service_spec

    spec = load_job_yaml("name: web\nkind: serve\n" + extra +
                         "serve: {model: tiny, slo_s: 1.0, latency: {cpu: [0.05], "
                         "gpu: [0.01]}}\n")
    if field is None:
        check_service_spec(spec, offered)
        return
    with pytest.raises(SpecError) as error:
        check_service_spec(spec, offered)
    assert error.value.field == field
