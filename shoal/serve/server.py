"""HTTP model server: FastAPI + uvicorn in front of the dynamic batcher and the tiny model.

Endpoints:
* ``POST /infer`` ``{"tokens": [ids], "deadline": unix_s | null, "slo_s": s | null}`` ->
  ``{"label", "confidence", "batch_size", "queue_s", "compute_s", "received_unix"}``;
  HTTP 503 with ``{"rejected": true, "stage", "detail", "received_unix"}`` when the request
  would miss its deadline (``deadline`` is absolute unix seconds; ``slo_s`` is relative to when
  the server receives the request).
* ``POST /profile`` ``{"batch_sizes": [...], "repeats": n}`` -> median seconds per batch size,
  measured on the inference thread of this process.
* ``GET /health``, ``GET /stats``.

Run one replica: ``python -m shoal.serve.server --port 0`` prints ``SHOAL_SERVE_PORT=<port>``
once it listens (port 0 = a free port chosen by the kernel); :mod:`shoal.serve.launch` starts
replicas and a router this way.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, model_validator

from shoal.serve.batcher import DeadlineRejected, DynamicBatcher, LatencyEstimate, profile_latency
from shoal.serve.launch import serve_app
from shoal.serve.tiny_model import Predictor
from shoal.serve.wire import SEQ_LEN, VOCAB, example_tokens


class InferRequest(BaseModel):
    tokens: Annotated[list[Annotated[int, Field(ge=0, lt=VOCAB)]],
                      Field(min_length=1, max_length=SEQ_LEN)]
    deadline: float | None = Field(None, description="absolute deadline, unix seconds")
    slo_s: float | None = Field(None, gt=0, description="deadline relative to receipt, seconds")

    @model_validator(mode="after")
    def _one_deadline(self) -> InferRequest:
        if self.deadline is not None and self.slo_s is not None:
            raise ValueError("give either 'deadline' (absolute) or 'slo_s' (relative), not both")
        return self


class ProfileRequest(BaseModel):
    batch_sizes: list[Annotated[int, Field(ge=1, le=256)]] = Field(min_length=1, max_length=64)
    repeats: int = Field(10, ge=1, le=200)


def create_app(max_batch: int = 8, max_wait_s: float = 0.005, seed: int = 0,
               admission: bool = True, startup_repeats: int = 5) -> FastAPI:
    """A replica serving the tiny model; it profiles itself at start-up to seed admission."""
    predictor = Predictor(seed)
    state: dict[str, DynamicBatcher] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sizes = list(range(1, max_batch + 1))
        table = await asyncio.to_thread(profile_latency, predictor, example_tokens, sizes,
                                        startup_repeats)
        batcher = DynamicBatcher(predictor, LatencyEstimate([table[s] for s in sizes]),
                                 max_batch=max_batch, max_wait_s=max_wait_s, admission=admission)
        batcher.start()
        state["batcher"] = batcher
        yield
        await batcher.stop()

    app = FastAPI(title="shoal model server", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"ok": True, "max_batch": max_batch, "max_wait_s": max_wait_s}

    @app.post("/infer")
    async def infer(request: InferRequest) -> JSONResponse:
        batcher = state["batcher"]
        received = time.time()
        deadline = request.deadline
        if request.slo_s is not None:
            deadline = received + request.slo_s
        try:
            served = await batcher.submit(request.tokens,
                                          float("inf") if deadline is None else deadline)
        except DeadlineRejected as exc:
            return JSONResponse(status_code=503, content={
                "rejected": True, "stage": exc.stage, "detail": str(exc),
                "received_unix": received, "expected_finish_unix": exc.expected_finish})
        label, confidence = served.result
        return JSONResponse({"label": label, "confidence": confidence,
                             "batch_size": served.batch_size, "queue_s": served.queue_s,
                             "compute_s": served.compute_s, "received_unix": received})

    @app.post("/profile")
    async def profile(request: ProfileRequest) -> dict[str, list]:
        batcher = state["batcher"]
        table = await batcher.run_exclusive(lambda: profile_latency(
            predictor, example_tokens, request.batch_sizes, request.repeats))
        return {"batch_sizes": list(table), "latency_s": list(table.values())}

    @app.get("/stats")
    async def stats() -> dict[str, object]:
        batcher = state["batcher"]
        return {**batcher.stats.as_dict(), "queued": batcher.queued,
                "latency_estimate_s": list(batcher.latency.latency_s)}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="shoal model server replica")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--no-admission", action="store_true",
                        help="serve every request, even ones that will miss their deadline")
    args = parser.parse_args(argv)
    if args.max_batch < 1:
        parser.error("--max-batch must be >= 1")
    if args.max_wait_ms < 0:
        parser.error("--max-wait-ms must be >= 0")
    torch.set_num_threads(args.threads)
    app = create_app(max_batch=args.max_batch, max_wait_s=args.max_wait_ms / 1000.0,
                     seed=args.seed, admission=not args.no_admission)
    serve_app(app, args.host, args.port)


if __name__ == "__main__":
    main(sys.argv[1:])
