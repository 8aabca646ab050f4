"""Router over model-server replicas: a FastAPI app that forwards each request to one replica.

Policies: ``round-robin``, or ``least-loaded`` (fewest requests in flight through this router;
ties go round-robin), the real counterpart of the simulator's dispatch to the replica with the
earliest expected finish. A replica's answer is passed back unchanged (a 503 admission reject
included); an unreachable replica gives HTTP 502.

The replica set can be replaced while the router runs (``PUT /replicas {"replicas": [urls]}``),
which is how a serve job is resized behind one stable URL; requests in flight finish on the
replica they were sent to.

With ``slo_s`` (``--slo``) the router also scores what it answers: a request meets the SLO when
its replica answered 200 within ``slo_s`` seconds of the router receiving it (503 rejects, 502s
and late answers are misses); ``/stats`` then has ``total_answered``, ``total_good`` and the p99
latency of the last ``LATENCY_WINDOW`` served requests.

Run: ``python -m shoal.serve.router --replica http://127.0.0.1:PORT [--replica ...]``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from shoal.serve.launch import serve_app
from shoal.serve.wire import no_delay_transport

POLICIES = ("least-loaded", "round-robin")
LATENCY_WINDOW = 2000  # served requests kept for the p99 latency in /stats



class ReplicaPicker:
    """Chooses a replica index and tracks requests in flight per replica."""

    def __init__(self, replicas: int, policy: str = "least-loaded"):
        if replicas < 1:
            raise ValueError("a router needs at least one replica")
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy '{policy}'; choose from {POLICIES}")
        self.policy = policy
        self.in_flight = [0] * replicas
        self.forwarded = [0] * replicas
        self._turn = itertools.cycle(range(replicas))

    def pick(self) -> int:
        if self.policy == "round-robin":
            return next(self._turn)
        n = len(self.in_flight)
        start = next(self._turn)
        order = [(start + k) % n for k in range(n)]
        return min(order, key=lambda i: self.in_flight[i])

    def begin(self, replica: int) -> None:
        self.in_flight[replica] += 1
        self.forwarded[replica] += 1

    def end(self, replica: int) -> None:
        self.in_flight[replica] -= 1


class ReplicaList(BaseModel):
    replicas: list[str] = Field(min_length=1, description="replica base URLs (http://...)")


def create_router_app(replica_urls: list[str], policy: str = "least-loaded",
                      transport: httpx.AsyncBaseTransport | None = None,
                      timeout_s: float = 60.0, slo_s: float | None = None) -> FastAPI:
    """The router app; ``transport`` replaces the network (tests); ``slo_s``: score answers
    against this latency SLO."""
    urls = [u.rstrip("/") for u in replica_urls]
    picker = ReplicaPicker(len(urls), policy)
    state: dict[str, httpx.AsyncClient] = {}
    routing: dict[str, tuple[list[str], ReplicaPicker]] = {"current": (urls, picker)}
    total = {"forwarded": 0}  # over every replica set, for rate measurements
    scored = {"answered": 0, "good": 0}
    latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)  # of served (200) requests

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(transport=transport or no_delay_transport(),
                                     timeout=timeout_s) as client:
            state["client"] = client
            yield

    app = FastAPI(title="shoal router", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"ok": True, "replicas": routing["current"][0], "policy": policy}

    @app.get("/stats")
    async def stats() -> dict[str, object]:
        urls, picker = routing["current"]
        out: dict[str, object] = {
            "replicas": urls, "policy": policy, "in_flight": picker.in_flight,
            "forwarded": picker.forwarded, "total_forwarded": total["forwarded"]}
        if slo_s is not None:
            ordered = sorted(latencies)
            p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else None
            out.update(slo_s=slo_s, total_answered=scored["answered"],
                       total_good=scored["good"], p99_latency_s=p99)
        return out

    @app.put("/replicas")
    async def set_replicas(body: ReplicaList) -> JSONResponse:
        bad = [u for u in body.replicas if not u.startswith(("http://", "https://"))]
        if bad:
            return JSONResponse(status_code=422, content={
                "detail": f"field 'replicas': not http URLs: {bad}"})
        new = [u.rstrip("/") for u in body.replicas]
        routing["current"] = (new, ReplicaPicker(len(new), policy))
        return JSONResponse({"replicas": new})

    @app.post("/infer")
    async def infer(request: Request) -> Response:
        received = time.monotonic()
        body = await request.body()
        urls, picker = routing["current"]
        total["forwarded"] += 1
        replica = picker.pick()
        picker.begin(replica)
        try:
            answer = await state["client"].post(
                f"{urls[replica]}/infer", content=body,
                headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            scored["answered"] += 1
            return JSONResponse(status_code=502, content={
                "detail": f"replica {urls[replica]} failed: {type(exc).__name__}: {exc}"})
        finally:
            picker.end(replica)
        if slo_s is not None:
            latency = time.monotonic() - received
            scored["answered"] += 1
            if answer.status_code == 200:
                latencies.append(latency)
                scored["good"] += latency <= slo_s
        return Response(content=answer.content, status_code=answer.status_code,
                        media_type="application/json",
                        headers={"x-shoal-replica": str(replica)})

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="shoal router over model-server replicas")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--replica", action="append", required=True,
                        help="replica base URL, e.g. http://127.0.0.1:8001 (repeat)")
    parser.add_argument("--policy", choices=POLICIES, default="least-loaded")
    parser.add_argument("--slo", type=float, default=None,
                        help="latency SLO in seconds: score answers against it in /stats")
    args = parser.parse_args(argv)
    if args.slo is not None and args.slo <= 0:
        parser.error("--slo must be > 0")
    serve_app(create_router_app(args.replica, args.policy, slo_s=args.slo), args.host,
              args.port)


if __name__ == "__main__":
    main(sys.argv[1:])
