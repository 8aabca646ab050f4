"""The model server app (in process, through FastAPI's test client) and the router app over fake
replicas."""

from __future__ import annotations

import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from shoal.serve.router import ReplicaPicker, create_router_app
from shoal.serve.server import create_app
from shoal.serve.tiny_model import Predictor, build_model
from shoal.serve.wire import SEQ_LEN, example_tokens


@pytest.fixture(scope="module")
def server():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with TestClient(create_app(max_batch=4, max_wait_s=0.001, startup_repeats=1)) as client:
            yield client
    finally:
        torch.set_num_threads(threads)


def test_same_seed_same_weights_and_answers():
    a, b, c = build_model(0), build_model(0), build_model(1)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters(),
                                                     strict=True))
    tokens = [example_tokens(i) for i in range(3)]
    assert Predictor(0)(tokens) == Predictor(0)(tokens)


def test_infer_serves_the_model(server):
    tokens = example_tokens(7)
    answer = server.post("/infer", json={"tokens": tokens, "slo_s": 30.0})
    assert answer.status_code == 200
    body = answer.json()
    label, confidence = Predictor(0)([tokens])[0]
    assert body["label"] == label
    assert body["confidence"] == pytest.approx(confidence, rel=1e-5)
    assert body["batch_size"] == 1 and body["compute_s"] > 0


def test_request_past_its_deadline_is_rejected_with_503(server):
    answer = server.post("/infer", json={"tokens": [1, 2, 3], "deadline": time.time() - 1.0})
    assert answer.status_code == 503
    assert answer.json()["rejected"] is True and answer.json()["stage"] == "arrival"
    assert server.get("/stats").json()["rejected_on_arrival"] >= 1


@pytest.mark.parametrize(("body", "field"), [
    ({"tokens": [1, 5000]}, "tokens"),
    ({"tokens": []}, "tokens"),
    ({"tokens": list(range(1, SEQ_LEN + 2))}, "tokens"),
    ({"tokens": [1], "slo_s": -1}, "slo_s"),
])
def test_bad_requests_name_the_field(server, body, field):
    answer = server.post("/infer", json=body)
    assert answer.status_code == 422
    assert field in {str(part) for err in answer.json()["detail"] for part in err["loc"]}


def test_deadline_and_slo_together_are_refused(server):
    answer = server.post("/infer", json={"tokens": [1], "slo_s": 1.0, "deadline": 1.0})
    assert answer.status_code == 422
    assert "either 'deadline'" in answer.text


def test_profile_endpoint_times_each_batch_size(server):
    answer = server.post("/profile", json={"batch_sizes": [1, 4], "repeats": 2})
    assert answer.status_code == 200
    body = answer.json()
    assert body["batch_sizes"] == [1, 4]
    assert all(t > 0 for t in body["latency_s"])


def test_picker_round_robin_and_least_loaded():
    rr = ReplicaPicker(3, "round-robin")
    assert [rr.pick() for _ in range(4)] == [0, 1, 2, 0]
    ll = ReplicaPicker(3, "least-loaded")
    ll.begin(0)
    ll.begin(1)
    assert ll.pick() == 2
    ll.begin(2)
    ll.begin(2)
    ll.end(0)
    assert ll.pick() == 0
    assert ll.forwarded == [1, 1, 2]
    with pytest.raises(ValueError, match="unknown routing policy"):
        ReplicaPicker(2, "random")


def test_router_forwards_and_passes_answers_back():
    hits: list[str] = []

    def replicas(request: httpx.Request) -> httpx.Response:
        hits.append(request.url.host)
        if request.url.host == "down":
            raise httpx.ConnectError("refused", request=request)
        status = 503 if b'"reject"' in request.content else 200
        return httpx.Response(status, json={"from": request.url.host})

    app = create_router_app(["http://a:1", "http://b:1", "http://down:1"], "round-robin",
                            transport=httpx.MockTransport(replicas))
    with TestClient(app) as client:
        answers = [client.post("/infer", json={"tokens": [1]}) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 502]
        assert [a.json().get("from") for a in answers[:2]] == ["a", "b"]
        assert "down" in answers[2].json()["detail"]
        rejected = client.post("/infer", json={"tokens": [1], "reject": True})
        assert rejected.status_code == 503 and rejected.headers["x-shoal-replica"] == "0"
        stats = client.get("/stats").json()
    assert hits == ["a", "b", "down", "a"]
    assert stats["forwarded"] == [2, 1, 1] and stats["in_flight"] == [0, 0, 0]
