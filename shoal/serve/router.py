"""Router over model-server replicas: a FastAPI app that forwards each request to one replica.

Policies: ``round-robin``, or ``least-loaded`` (fewest requests in flight through this router;
ties go round-robin), the real counterpart of the simulator's dispatch to the replica with the
earliest expected finish. A replica's answer is passed back unchanged (a 503 admission reject
included); an unreachable replica gives HTTP 502.

Run: ``python -m shoal.serve.router --replica http://127.0.0.1:PORT [--replica ...]``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from shoal.serve.launch import serve_app
from shoal.serve.wire import no_delay_transport

POLICIES = ("least-loaded", "round-robin")



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


def create_router_app(replica_urls: list[str], policy: str = "least-loaded",
                      transport: httpx.AsyncBaseTransport | None = None,
                      timeout_s: float = 60.0) -> FastAPI:
    """The router app; ``transport`` replaces the network (tests)."""
    urls = [u.rstrip("/") for u in replica_urls]
    picker = ReplicaPicker(len(urls), policy)
    state: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(transport=transport or no_delay_transport(),
                                     timeout=timeout_s) as client:
            state["client"] = client
            yield

    app = FastAPI(title="shoal router", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"ok": True, "replicas": urls, "policy": policy}

    @app.get("/stats")
    async def stats() -> dict[str, object]:
        return {"replicas": urls, "policy": policy, "in_flight": picker.in_flight,
                "forwarded": picker.forwarded}

    @app.post("/infer")
    async def infer(request: Request) -> Response:
        body = await request.body()
        replica = picker.pick()
        picker.begin(replica)
        try:
            answer = await state["client"].post(
                f"{urls[replica]}/infer", content=body,
                headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            return JSONResponse(status_code=502, content={
                "detail": f"replica {urls[replica]} failed: {type(exc).__name__}: {exc}"})
        finally:
            picker.end(replica)
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
    args = parser.parse_args(argv)
    serve_app(create_router_app(args.replica, args.policy), args.host, args.port)


if __name__ == "__main__":
    main(sys.argv[1:])
