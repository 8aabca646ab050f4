"""The service with ``--backend ray`` on a real two-node loopback cluster.

Jobs are real training processes (tests/local/tiny_job.py) in Ray actors, on the nodes the
scheduler chose; a node is lost mid-training by killing its Ray processes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from shoal.serve.wire import example_tokens
from tests.ray.cluster import HEAD_IP, WORKER_IP, LoopbackCluster
from tests.service.helpers import Service, all_done, running_service, wait_until

pytestmark = pytest.mark.slow

# What each node offers (tests/ray/conftest.py): the type of every replica must be offered
# by the node it ran on.
TYPES_AT = {HEAD_IP: {"cpu", "fast"}, WORKER_IP: {"cpu", "slow"}}
RAY_OPTIONS: dict[str, object] = {"backend": "ray", "policy": "gavel", "max_retries": 3}
SAMPLES = 256  # tiny_job's data set
_HEADER = re.compile(r"=== shoal: attempt (\d+), (\d+) replica\(s\) on (\S+), \S+ === "
                     r"rank (\d+), Ray node \w+, host \S+ \(([\d.]+)\)")


def ray_job(name: str, types: list[str] | None, epochs: int, sleep: float,
            replicas: int = 1) -> str:
    allowed = f"device_types: {json.dumps(types)}\n" if types else ""
    return (
        f"name: {name}\napplication: tiny\nbatch_size: 16\ntarget_epochs: {epochs}\n"
        f"num_replicas: {replicas}\nmin_replicas: 1\nmax_replicas: {replicas}\n{allowed}"
        f'command: ["python", "tests/local/tiny_job.py", "--epochs", "{epochs}", '
        f'"--sleep", "{sleep}"]\n'
    )


def placements(service: Service, name: str) -> list[tuple[int, int, str, int, str]]:
    """(attempt, replicas, device type, rank, node address) of every replica that started."""
    found = []
    for path in sorted((service.home / "logs" / name).glob("rank*.log")):
        for match in _HEADER.finditer(path.read_text(errors="replace")):
            attempt, replicas, dtype, rank, address = match.groups()
            found.append((int(attempt), int(replicas), dtype, int(rank), address))
    return sorted(found)


def done(checkpoints: Path, name: str) -> dict[str, int]:
    return json.loads((checkpoints / name / "done.json").read_text())


def events(service: Service, name: str) -> list[dict[str, object]]:
    return service.get("/api/events", job=name)


def first_time(items: list[dict[str, object]], kind: str) -> float:
    return min(float(e["time"]) for e in items if e["kind"] == kind)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared") / "checkpoints"  # "shared": every node reads it


@pytest.fixture(scope="module")
def service(ray_cluster: LoopbackCluster, checkpoints: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("ray-service") / "home"
    with running_service(home, address=ray_cluster.address, checkpoint_dir=str(checkpoints),
                         **RAY_OPTIONS) as svc:
        yield svc


def test_pool_is_read_from_the_cluster(service: Service) -> None:
    cluster = service.get("/api/cluster")
    offered = sorted((n["device_type"], n["capacity"]) for n in cluster["nodes"])
    assert offered == [("cpu", 1), ("cpu", 1), ("fast", 1), ("slow", 1)], cluster
    assert "2 node(s)" in cluster["pool"] and cluster["policy"] == "gavel"


def test_spanning_and_concurrent_jobs_land_on_their_types(service: Service,
                                                          checkpoints: Path) -> None:
    # Two cpu replicas need both nodes; "fast" exists only on the head, "slow" on the other.
    jobs = {
        "span": ray_job("span", ["cpu"], epochs=4, sleep=0.1, replicas=2),
        # Long enough (about 10 s of steps) that the spanning job's two-node start, slow on
        # a loaded machine, falls within it.
        "on-fast": ray_job("on-fast", ["fast"], epochs=6, sleep=0.1),
        "on-slow": ray_job("on-slow", ["slow"], epochs=2, sleep=0.05),
    }
    for text in jobs.values():
        assert service.submit(text).status_code == 201
    wait_until(lambda: all_done(service, list(jobs)), 150, "the three jobs",
               service.diagnostics)
    for name in jobs:
        job = service.job(name)
        assert job["state"] == "finished", (name, job.get("failure"), service.log_text(name))
        assert done(checkpoints, name)["samples"] == SAMPLES * job["spec"]["target_epochs"]
        for _, _, dtype, _, address in placements(service, name):
            assert dtype in TYPES_AT[address], (name, placements(service, name))

    # The spanning job trained with gloo across both nodes, two ranks, to its end.
    span = placements(service, "span")
    assert {(rank, address) for _, n, _, rank, address in span if n == 2} == {
        (0, span[0][4]), (1, WORKER_IP if span[0][4] == HEAD_IP else HEAD_IP)}
    assert done(checkpoints, "span")["world_size"] == 2
    assert "replicas=2" in service.log_text("span")
    # Each single-node job ran on the node of its type.
    assert {p[4] for p in placements(service, "on-fast")} == {HEAD_IP}
    assert {p[4] for p in placements(service, "on-slow")} == {WORKER_IP}
    # Their step times reached the scheduler under the type they were measured on.
    for name, dtype in (("on-fast", "fast"), ("on-slow", "slow"), ("span", "cpu")):
        profile = service.job(name).get("profile") or []
        assert profile and {row.get("device_type") for row in profile} == {dtype}, profile
    # The fast job ran while the spanning one did (it started before the other finished).
    span_events, fast_events = events(service, "span"), events(service, "on-fast")
    assert first_time(fast_events, "running") < first_time(span_events, "finished")
    assert first_time(span_events, "running") < first_time(fast_events, "finished")
    assert all(n["used"] == 0 for n in service.get("/api/cluster")["nodes"])


def test_a_job_that_may_use_every_type_is_probed_on_the_types_it_is_not_placed_on(
        service: Service, checkpoints: Path) -> None:
    assert service.submit(ray_job("probed", None, epochs=10, sleep=0.1)).status_code == 201
    wait_until(lambda: all_done(service, ["probed"]), 150, "the probed job",
               service.diagnostics)
    job = service.job("probed")
    assert job["state"] == "finished", (job.get("failure"), service.log_text("probed"))
    ran_on = {dtype for _, _, dtype, _, _ in placements(service, "probed")}
    probe_logs = {path.name for path in (service.home / "logs" / "probed").glob("probe-*.log")}
    probed = {name[len("probe-"):-len(".log")] for name in probe_logs}
    # Once placed, it was probed on every type it did not run on, never on the type of its
    # first placement (its own run measures that one), and each probe measured its steps.
    first_type = placements(service, "probed")[0][2]
    assert {"cpu", "fast", "slow"} - ran_on <= probed, (probed, ran_on)
    assert first_type not in probed, (first_type, probed)
    for dtype in probed:
        text = (service.home / "logs" / "probed" / f"probe-{dtype}.log").read_text()
        assert f"probe of 10 steps on {dtype}" in text and "probe of 10 steps done" in text, text
    profile = job.get("profile") or []
    assert {row.get("device_type") for row in profile} == {"cpu", "fast", "slow"}, profile
    assert job["profiling_seconds"] > 0
    # The probes trained from scratch elsewhere: the job's own progress is exactly its epochs.
    assert done(checkpoints, "probed")["samples"] == SAMPLES * 10
    assert all(n["used"] == 0 for n in service.get("/api/cluster")["nodes"])


SERVE_YAML = """name: web
kind: serve
device_types: [cpu]
serve:
  model: tiny
  slo_s: 30.0
  latency: {cpu: [0.05]}
  min_replicas: 2
  max_replicas: 2
"""


def test_a_serve_job_runs_its_model_servers_on_the_chosen_nodes(service: Service) -> None:
    # Two cpu replicas: one on each node, behind the router on the service's machine.
    assert service.submit(SERVE_YAML).status_code == 201
    def serving_on_two() -> bool:
        metrics = service.job("web").get("service") or {}
        return metrics.get("replicas") == 2 and metrics.get("url") is not None

    wait_until(serving_on_two, 120, "both model servers behind the router",
               service.diagnostics)
    url = service.job("web")["service"]["url"]
    wait_until(lambda: len(httpx.get(f"{url}/stats", timeout=10.0).json()["replicas"]) == 2,
               30, "the router forwarding to both", service.diagnostics)
    routed = httpx.get(f"{url}/stats", timeout=10.0).json()["replicas"]
    assert {urlsplit(u).hostname for u in routed} == {HEAD_IP, WORKER_IP}, routed
    with httpx.Client(timeout=30.0) as client:
        for i in range(4):
            answer = client.post(f"{url}/infer", json={"tokens": example_tokens(i)})
            assert answer.status_code == 200, answer.text
    logs = sorted((service.home / "logs" / "web").glob("replica-*.log"))
    hosts = {m.group(1) for path in logs
             for m in re.finditer(r"Ray node \w+, host \S+ \(([\d.]+)\)", path.read_text())}
    assert hosts == {HEAD_IP, WORKER_IP}, [p.read_text()[:300] for p in logs]
    stats = httpx.get(f"{url}/stats", timeout=10.0).json()
    assert stats["total_forwarded"] >= 4
    assert service.http.post(f"{service.url}/api/jobs/web/cancel").status_code == 200
    wait_until(lambda: all(n["used"] == 0 for n in service.get("/api/cluster")["nodes"]), 30,
               "the servers' devices back", service.diagnostics)


STREAM_YAML = """name: feed
kind: stream
device_types: [cpu]
stream: {input_rate: 120, throughput: {cpu: 80}, max_lag_s: 5, max_replicas: 2, startup_s: 1}
"""


def test_a_stream_job_runs_its_workers_on_the_chosen_nodes(service: Service) -> None:
    # 1.2 x 120 samples/s needs two 80/s workers: one on each node's cpu device.
    assert service.submit(STREAM_YAML).status_code == 201

    def feed() -> dict[str, object]:
        return service.job("feed").get("service") or {}

    wait_until(lambda: feed().get("replicas") == 2 and (feed().get("processed") or 0) > 200,
               120, "two workers processing the stream", service.diagnostics)
    wait_until(lambda: (feed().get("lag_s") or 99.0) < 1.0, 60, "the workers keeping up",
               service.diagnostics)
    nodes = set()
    for path in (service.home / "logs" / "feed").glob("worker-*.log"):
        text = path.read_text()
        assert "SHOAL_SERVE_PORT=0" in text, text  # it loaded the model and took work
        nodes |= set(re.findall(r"host \S+ \(([\d.]+)\)", text))
    assert nodes == {HEAD_IP, WORKER_IP}, nodes
    service.http.post(f"{service.url}/api/jobs/feed/cancel").raise_for_status()
    wait_until(lambda: all(n["used"] == 0 for n in service.get("/api/cluster")["nodes"]), 30,
               "the workers' devices back", service.diagnostics)


def test_lost_node_resizes_and_resumes_from_checkpoint(service: Service, checkpoints: Path,
                                                       ray_cluster: LoopbackCluster) -> None:
    epochs = 6
    text = ray_job("survivor", ["cpu"], epochs=epochs, sleep=0.1, replicas=2)
    assert service.submit(text).status_code == 201
    state = checkpoints / "survivor" / "state.pt"

    def spanning_and_checkpointed() -> bool:
        job = service.job("survivor")
        alloc = job.get("allocation") or {}
        return (job["state"] == "running" and alloc.get("replicas") == 2
                and job.get("steps", 0) > 0 and state.exists())

    wait_until(spanning_and_checkpointed, 120, "survivor to train on both nodes and checkpoint",
               service.diagnostics)
    ids_before = {n["node_id"] for n in service.get("/api/cluster")["nodes"]}
    assert ray_cluster.kill_node(WORKER_IP) > 0
    wait_until(lambda: any(e["detail"] == "node lost" for e in events(service, "survivor")),
               60, "the node loss to be noticed", service.diagnostics)
    # While the job finishes on what is left, a new node joins (offering a type it may not use).
    ray_cluster.start_worker({"shoal:slow": 1.0})
    wait_until(lambda: all_done(service, ["survivor"]), 150, "survivor to finish",
               service.diagnostics)
    wait_until(lambda: len(service.get("/api/cluster")["nodes"]) == 3, 60,
               "the new node to join", service.diagnostics)
    job = service.job("survivor")
    assert job["state"] == "finished", (job.get("failure"), service.log_text("survivor"))
    sizes = [run["replicas"] for run in job["runs"]]
    assert sizes[0] == 2 and sizes[-1] == 1, job["runs"]
    assert any(e["detail"] == "node lost" for e in events(service, "survivor"))
    assert "restored at step" in service.log_text("survivor")
    last_attempt = max(p[0] for p in placements(service, "survivor"))
    assert {p[4] for p in placements(service, "survivor") if p[0] == last_attempt} == {HEAD_IP}
    record = done(checkpoints, "survivor")
    assert record["world_size"] == 1
    assert record["samples"] == epochs * SAMPLES  # nothing lost, nothing counted twice
    nodes = service.get("/api/cluster")["nodes"]
    assert sorted(n["device_type"] for n in nodes) == ["cpu", "fast", "slow"]

    joined = {n["node_id"]: n["device_type"] for n in service.get("/api/cluster")["nodes"]}
    new = {i: t for i, t in joined.items() if i not in ids_before}
    assert sorted(new.values()) == ["slow"], (joined, ids_before)  # ids are never reused
