"""The HTTP API (FastAPI; OpenAPI schema at /docs). Every route calls into the Runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

from shoal import __version__
from shoal.service.runner import DuplicateJob, Runner
from shoal.spec.errors import SpecError
from shoal.spec.job import load_job_yaml, parse_job

STATIC = Path(__file__).resolve().parent / "static"  # the dashboard's page, script, style


def _spec_error(exc: SpecError, status: int = 422) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"detail": {"message": str(exc), "field": exc.field}},
    )


# Log offsets are byte positions; past this, seek() itself fails (a bad client value).
MAX_LOG_OFFSET = 2**62


def _parse_body(body: bytes, content_type: str) -> Any:
    """A job spec from JSON or YAML (YAML is a superset, but JSON errors read better)."""
    text = body.decode("utf-8", errors="replace")
    if "json" in content_type:
        try:
            return parse_job(json.loads(text), source="request body")
        except json.JSONDecodeError as exc:
            raise SpecError(f"not valid JSON: {exc}", source="request body") from exc
    return load_job_yaml(text, source="request body")


def create_app(runner: Runner) -> FastAPI:
    app = FastAPI(
        title="shoal",
        version=__version__,
        description="Demand-aware scheduling of deep-learning jobs: the local scheduler service.",
    )

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return {
            "ok": True,
            "version": __version__,
            "home": str(runner.config.home),
            "policy": runner.scheduler.policy.name,
            "database": runner.store.engine.url.render_as_string(hide_password=True),
        }

    @app.post("/api/jobs", status_code=201)
    async def submit(request: Request, workdir: str | None = None) -> Any:
        """Submit a job: a YAML (``application/yaml``, ``text/plain``) or JSON spec body.

        ``workdir`` is where the job's command runs (the submitting shell's directory;
        default: the service's). A malformed spec answers 422 naming the field.
        """
        body = await request.body()
        try:
            spec = _parse_body(body, request.headers.get("content-type", ""))
            folder = Path(workdir) if workdir else None
            if folder is not None and not folder.is_dir():
                raise SpecError(f"{workdir} is not a directory", field="workdir")
            return await run_in_threadpool(runner.submit, spec, folder)
        except DuplicateJob as exc:
            return _spec_error(exc, 409)
        except SpecError as exc:
            return _spec_error(exc)

    @app.get("/api/jobs")
    def list_jobs() -> list[dict[str, Any]]:
        return runner.jobs()

    @app.get("/api/jobs/{name}")
    def show_job(name: str) -> dict[str, Any]:
        try:
            return runner.job(name)
        except KeyError:
            raise HTTPException(404, f"no job named '{name}'") from None

    @app.post("/api/jobs/{name}/cancel")
    def cancel_job(name: str) -> dict[str, Any]:
        try:
            return runner.cancel(name)
        except KeyError:
            raise HTTPException(404, f"no job named '{name}'") from None

    @app.post("/api/jobs/{name}/report")
    def report(name: str, payload: dict[str, Any]) -> dict[str, Any]:
        """What a training job measured (shoal.train); may answer with a new batch size."""
        try:
            return runner.report(name, payload)
        except KeyError:
            raise HTTPException(404, f"no active job named '{name}'") from None

    @app.get("/api/jobs/{name}/logs", response_class=PlainTextResponse)
    def logs(name: str, rank: int = Query(0, ge=0),
             offset: int = Query(0, ge=0, le=MAX_LOG_OFFSET)) -> PlainTextResponse:
        """Log text of one replica from byte ``offset``; header X-Next-Offset: where next."""
        try:
            path = runner.log_path(name, rank)
        except KeyError:
            raise HTTPException(404, f"no job named '{name}'") from None
        data = b""
        if path.exists():
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read(1 << 20)
        return PlainTextResponse(
            data.decode("utf-8", errors="replace"),
            headers={"X-Next-Offset": str(offset + len(data))},
        )

    @app.get("/api/cluster")
    def cluster() -> dict[str, Any]:
        return runner.cluster()

    @app.get("/api/events")
    def events(job: str | None = None, after: int = 0,
               last: int | None = Query(None, ge=1, le=1000)) -> list[dict[str, Any]]:
        """Events after id ``after``, oldest first; ``last=N``: only the newest N of them."""
        return runner.events(job, after, last)

    @app.get("/api/spec-example", response_class=PlainTextResponse)
    def spec_example() -> str:
        return yaml.safe_dump(
            {"name": "my-job", "application": "my-model", "batch_size": 64,
             "target_epochs": 10, "max_replicas": 4, "command": ["python", "train.py"]},
            sort_keys=False,
        )

    @app.get("/", include_in_schema=False)
    @app.get("/dashboard", include_in_schema=False)
    def dashboard() -> FileResponse:
        """The web dashboard: a static page that polls this API (docs/service.md)."""
        return FileResponse(STATIC / "dashboard.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
