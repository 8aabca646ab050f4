"""Start and stop a home's service as a background process (used by the CLI, demo, tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from shoal.service.config import port_path, read_info


class LaunchError(RuntimeError):
    pass


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def choose_port(home: Path, requested: int | None = None) -> int:
    """``requested``, else this home's previous port when free, else any free port."""
    if requested:
        return requested
    try:
        previous = int(port_path(home).read_text())
        if _port_free(previous):
            return previous
    except (FileNotFoundError, ValueError):
        pass
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthy(url: str, timeout_s: float = 1.0) -> bool:
    try:
        return httpx.get(f"{url}/api/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def running_url(home: Path) -> str | None:
    info = read_info(home)
    if info and healthy(str(info["url"])):
        return str(info["url"])
    return None


def service_command(home: Path, port: int, options: dict[str, object]) -> list[str]:
    command = [sys.executable, "-m", "shoal.service", "--home", str(home), "--port", str(port)]
    for key, value in options.items():
        values = value if isinstance(value, list | tuple) else [value]
        for item in values:
            if item is not None:
                command += [f"--{key.replace('_', '-')}", str(item)]
    return command


def start_background(
    home: Path, port: int | None = None, timeout_s: float = 90.0, **options: object
) -> tuple[str, int]:
    """Start the service detached; return (url, pid) once its API answers."""
    home.mkdir(parents=True, exist_ok=True)
    port = choose_port(home, port)
    port_path(home).write_text(str(port))
    log = (home / "service.log").open("ab")
    process = subprocess.Popen(
        service_command(home, port, options),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LaunchError(
                f"the service exited with code {process.returncode}; see {home / 'service.log'}:\n"
                + _tail(home / "service.log")
            )
        info = read_info(home)
        if info and int(info.get("pid", -1)) == process.pid and healthy(url):  # type: ignore[call-overload]
            return url, process.pid
        time.sleep(0.2)
    process.terminate()
    raise LaunchError(f"the service did not answer within {timeout_s:.0f} s")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def stop(home: Path, timeout_s: float = 120.0) -> bool:
    """SIGTERM the home's service (it checkpoints its jobs) and wait; False if none ran."""
    info = read_info(home)
    if not info:
        return False
    pid = int(info["pid"])  # type: ignore[call-overload]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        (home / "service.json").unlink(missing_ok=True)
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.2)
    raise LaunchError(f"the service (pid {pid}) did not stop within {timeout_s:.0f} s")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
