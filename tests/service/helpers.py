"""Start a real service in a temporary SHOAL_HOME and talk to it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from shoal.service.config import read_info
from shoal.service.launch import start_background, stop

REPO = Path(__file__).resolve().parents[2]
SERVICE_OPTIONS: dict[str, object] = {
    "interval": 1.0,
    "slots": 2,
    "cores_per_slot": 1,
    "checkpoint_interval": 2.0,
    "max_retries": 2,
    "backoff": 0.5,
    "restart_delay": 2.0,
    "policy": "pollux",
}


def job_yaml(name: str, epochs: int = 3, sleep: float = 0.05, max_replicas: int = 2) -> str:
    return (
        f"name: {name}\napplication: tiny\nbatch_size: 16\ntarget_epochs: {epochs}\n"
        f"min_replicas: 1\nmax_replicas: {max_replicas}\n"
        f'command: ["python", "tests/local/tiny_job.py", "--epochs", "{epochs}", '
        f'"--sleep", "{sleep}"]\n'
    )


class Service:
    def __init__(self, home: Path, **options: object):
        self.home = home
        self.options = {**SERVICE_OPTIONS, **options}
        self.url = ""
        self.pid = 0
        self.http = httpx.Client(timeout=30)
        self.start()

    def start(self) -> None:
        self.url, self.pid = start_background(self.home, **self.options)

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(f"{self.url}{path}", params=params)
        response.raise_for_status()
        return response.json()

    def submit(self, text: str) -> httpx.Response:
        return self.http.post(
            f"{self.url}/api/jobs", content=text.encode(),
            headers={"content-type": "application/yaml"}, params={"workdir": str(REPO)},
        )

    def job(self, name: str) -> dict[str, Any]:
        return self.get(f"/api/jobs/{name}")

    def jobs(self) -> list[dict[str, Any]]:
        return self.get("/api/jobs")

    def kill(self) -> None:
        """SIGKILL the service process (its jobs' replicas live on)."""
        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the service cleanly (``shoal down``): its jobs checkpoint."""
        if read_info(self.home):
            stop(self.home)

    def close(self) -> None:
        self.stop()
        self.http.close()

    def log_text(self, name: str) -> str:
        logs = sorted((self.home / "logs" / name).glob("rank*.log"))
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')}" for p in logs)

    def diagnostics(self) -> str:
        service_log = (self.home / "service.log")
        text = service_log.read_text(errors="replace")[-3000:] if service_log.exists() else ""
        try:
            jobs = json.dumps(self.jobs(), indent=1, default=str)[-4000:]
        except httpx.HTTPError as exc:
            jobs = f"(service unreachable: {exc})"
        return f"service log tail:\n{text}\njobs:\n{jobs}"


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str,
               diagnostics: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n"
                                 + diagnostics())
        time.sleep(0.25)


@contextlib.contextmanager
def running_service(home: Path, **options: object) -> Iterator[Service]:
    service = Service(home, **options)
    try:
        yield service
    finally:
        service.close()


def all_done(service: Service, names: list[str]) -> bool:
    states = {j["name"]: j["state"] for j in service.jobs()}
    return all(states.get(n) in ("finished", "failed") for n in names)
