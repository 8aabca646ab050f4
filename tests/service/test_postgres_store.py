"""The store on a real PostgreSQL server started in a temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.service.config import ServiceConfig
from shoal.service.runner import Runner
from shoal.service.store import Store
from shoal.spec.job import parse_job

REPO = Path(__file__).resolve().parents[2]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(candidates[-1]) if candidates else None


def _as_postgres(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: cannot start PostgreSQL as postgres")
    # Not under pytest's tmp dir: its parents are private to us, and the server runs as postgres.
    base = Path(tempfile.mkdtemp(prefix="shoal-pg-"))
    data = base / "data"
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    init = subprocess.run(
        _as_postgres([initdb, "-D", str(data), "-U", "shoal", "--auth=trust"]),
        capture_output=True, text=True,
    )
    assert init.returncode == 0, init.stderr
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {base}"
    subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-o", options, "-w", "-l",
                                 str(base / "pg.log"), "start"]), check=True,
                   capture_output=True)
    try:
        yield f"postgresql+psycopg://shoal@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _database(server_url: str, name: str) -> str:
    """A new, empty database on the test server."""
    from sqlalchemy import create_engine, text

    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def test_store_round_trip_on_postgres(postgres_url: str) -> None:
    store = Store(_database(postgres_url, "roundtrip"))
    store.save_jobs([{
        "name": "pg-job", "seq": 0, "spec": {"name": "pg-job", "application": "x"},
        "workdir": "/tmp", "state": "pending", "submit_time": 1.0, "history": [[1.0, None]],
        "num_starts": 0, "device_seconds": 0.0, "summary": {"progress": 0.5},
    }])
    store.add_events([(1.0, "pg-job", "submitted", "")])
    rows = store.jobs()
    assert [(r.name, r.summary["progress"], r.history) for r in rows] == [
        ("pg-job", 0.5, [[1.0, None]])
    ]
    assert [e.kind for e in store.events("pg-job")] == ["submitted"]
    store.close()


def test_runner_runs_jobs_and_recovers_from_postgres(postgres_url: str, tmp_path: Path) -> None:
    url = _database(postgres_url, "service")
    config = ServiceConfig(home=tmp_path / "home", port=1, db_url=url, slots=2,
                           interval_s=0.2, backoff_s=0.1)
    runner = Runner(config)
    quick = parse_job({"name": "quick", "application": "x",
                       "command": ["python", "-c", "print('hello from quick')"]})
    runner.submit(quick, REPO)
    deadline = time.monotonic() + 30
    while runner.job("quick")["state"] != "finished" and time.monotonic() < deadline:
        runner.round()
        time.sleep(0.2)
    assert runner.job("quick")["state"] == "finished"
    runner.shutdown()

    again = Runner(config)  # a restarted service reads its jobs back from PostgreSQL
    job = again.job("quick")
    assert job["state"] == "finished" and job["jct"] is not None
    assert [j["name"] for j in again.jobs()] == ["quick"]
    kinds = [e["kind"] for e in again.events("quick", 0)]
    assert kinds[0] == "submitted" and kinds[-1] == "finished"
    again.shutdown()
