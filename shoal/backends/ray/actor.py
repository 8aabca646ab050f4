"""The Ray actor that runs one replica: the user's unchanged command in a child process.

It plays the local backend's shim on a Ray node: it starts the command with the replica's
contract environment, forwards signals to it, keeps its output for the service to fetch and
returns its exit code. The child dies with the actor (``PR_SET_PDEATHSIG``), so a lost node or
a killed actor never leaves a training process behind. Methods run in threads
(``max_concurrency``), so ``run`` blocks while ``signal`` and ``read_log`` answer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

LOG_LIMIT = 16 << 20  # bytes of output kept for the service to fetch; older output is dropped
_EXIT_CHECKPOINTED = 3  # shoal.backends.local.job.EXIT_CHECKPOINTED, kept import-free here

# Runs first in the child: die with the parent, then become the command (exec keeps the pid).
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"  # PR_SET_PDEATHSIG
    "os.getppid() == int(sys.argv[1]) or os._exit(137)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def local_command(command: Sequence[str]) -> list[str]:
    """``python``/``python3`` means the interpreter this node's Ray workers run."""
    if command and command[0] in ("python", "python3"):
        return [sys.executable, *command[1:]]
    return list(command)


class ReplicaActor:
    def __init__(self, header: str) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending: int | None = None  # a signal that arrived before the command started
        self._started = threading.Event()
        self._log = bytearray()
        self._log_base = 0  # stream offset of self._log[0]
        where = f"host {socket.gethostname()} ({self.where()['address']})"
        self._append(f"{header}, {where}\n".encode())

    # ----- queries -----
    def where(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        return {"address": ray.util.get_node_ip_address(), "ray_id": context.get_node_id(),
                "pid": os.getpid()}

    def free_port(self) -> int:
        with socket.socket() as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def pid(self, timeout_s: float = 60.0) -> int | None:
        """The training process's pid once it started (None if it never did)."""
        self._started.wait(timeout_s)
        proc = self._proc
        return None if proc is None else proc.pid

    # ----- the replica -----
    def run(self, command: Sequence[str], env: Mapping[str, str], drop: Sequence[str],
            cwd: str, port: int) -> int:
        """Run the command to its end; its exit code (negative: killed by that signal)."""
        full = {k: v for k, v in os.environ.items() if k not in drop}
        full.update(env)
        full["MASTER_PORT"] = str(port)
        wrapped = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()),
                   *local_command(command)]
        with self._lock:
            if self._pending is not None:
                self._started.set()
                stopped = self._pending in (signal.SIGTERM, signal.SIGINT)
                return _EXIT_CHECKPOINTED if stopped else -self._pending
            try:
                self._proc = subprocess.Popen(
                    wrapped, cwd=cwd, env=full, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                )
            except OSError as exc:
                self._append(f"shoal: cannot start {list(command)} in {cwd}: {exc}\n".encode())
                self._started.set()
                return 127
            self._started.set()
        proc = self._proc
        reader = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        reader.start()
        code = proc.wait()
        reader.join(10)
        return code

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            self._append(chunk)

    def _append(self, data: bytes) -> None:
        with self._lock:
            self._log += data
            overflow = len(self._log) - LOG_LIMIT
            if overflow > 0:
                del self._log[:overflow]
                self._log_base += overflow

    def signal(self, signum: int) -> None:
        """Signal the command's process group (it and its workers); or stop it before start."""
        with self._lock:
            proc = self._proc
            if proc is None:
                self._pending = signum
                return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)

    def read_log(self, offset: int) -> tuple[int, bytes]:
        """Output from stream position ``offset`` on: (position of the first byte, bytes)."""
        with self._lock:
            start = max(offset, self._log_base)
            return start, bytes(self._log[start - self._log_base:])

    def ping(self) -> float:
        return time.time()
