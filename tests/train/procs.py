"""Start the toy job as real processes with the env contract a backend sets (no torchrun).

Processes fork from a forkserver that has imported torch once, so a launch costs milliseconds
instead of a fresh interpreter's torch import (several seconds on a loaded 2-core machine).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
)
_MP = mp.get_context("forkserver")
_MP.set_forkserver_preload(["torch", "shoal.train", "tests.train.toy_job"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child(env: dict[str, str], log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    from tests.train import toy_job

    toy_job.main()


def launch_rank(rank: int, world_size: int, port: int, out: Path, **extra: str) -> BaseProcess:
    """Start one rank of the toy job (its peers are started separately)."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": "lo",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "OMP_NUM_THREADS": "1",
        "SHOAL_JOB": "toy",
        "SHOAL_CHECKPOINT_DIR": str(out / "checkpoint"),
        "TOY_OUT": str(out),
        **extra,
    }
    log = out / f"log-ws{world_size}-rank{rank}-{time.monotonic_ns()}.txt"
    proc = _MP.Process(target=_child, args=(env, str(log)), daemon=True)
    proc.start()
    return proc


def launch(world_size: int, out: Path, **extra: str) -> list[BaseProcess]:
    port = free_port()
    return [launch_rank(rank, world_size, port, out, **extra) for rank in range(world_size)]


def wait_all(procs: list[BaseProcess], timeout_s: float = 60.0) -> list[int | None]:
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.join(max(0.1, deadline - time.monotonic()))
    if any(p.is_alive() for p in procs):
        for p in procs:
            p.kill()
        raise TimeoutError("training processes did not exit in time")
    return [p.exitcode for p in procs]


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def progress(out: Path) -> int:
    try:
        return int((out / "progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def logs(out: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text()}" for p in sorted(out.glob("log-*.txt")))
