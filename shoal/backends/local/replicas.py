"""A job's replica processes on this machine: start, signal, poll, and re-adopt after restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

EXIT_VANISHED = -9  # the process is gone and left no exit code: it was killed


def _proc_alive(pid: int, marker: str) -> bool:
    """True when ``pid`` runs, is not a zombie, and its command line contains ``marker``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and marker in cmdline


@dataclass
class Replica:
    rank: int
    shim_pid: int
    exit_file: Path
    pid_file: Path
    popen: subprocess.Popen[bytes] | None = None  # None when adopted from an earlier service

    def recorded_exit(self) -> int | None:
        try:
            return int(self.exit_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def exit_code(self) -> int | None:
        """The replica's exit code, or None while it runs."""
        recorded = self.recorded_exit()
        if recorded is not None:
            if self.popen is not None:
                self.popen.poll()  # reap the shim
            return recorded
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return None
            recorded = self.recorded_exit()
            return recorded if recorded is not None else code
        if _proc_alive(self.shim_pid, str(self.exit_file)):
            return None
        recorded = self.recorded_exit()
        return recorded if recorded is not None else EXIT_VANISHED

    @property
    def pid(self) -> int | None:
        """The training process's pid (the shim's child)."""
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def signal(self, signum: int) -> None:
        """Signal the replica's whole process group (the shim, the script, its workers)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.shim_pid, signum)

    def to_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "shim_pid": self.shim_pid,
            "exit_file": str(self.exit_file),
            "pid_file": str(self.pid_file),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Replica:
        return cls(
            int(data["rank"]),  # type: ignore[arg-type]
            int(data["shim_pid"]),  # type: ignore[arg-type]
            Path(str(data["exit_file"])),
            Path(str(data["pid_file"])),
        )


def spawn(
    rank: int,
    command: list[str],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    run_dir: Path,
    attempt: int,
) -> Replica:
    exit_file = run_dir / f"attempt{attempt}-rank{rank}.exit"
    pid_file = run_dir / f"attempt{attempt}-rank{rank}.pid"
    for stale in (exit_file, pid_file):
        stale.unlink(missing_ok=True)
    shim = [sys.executable, "-m", "shoal.backends.local.shim", str(exit_file), str(pid_file), "--"]
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            [*shim, *command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Replica(rank, popen.pid, exit_file, pid_file, popen)


def save_replicas(path: Path, replicas: list[Replica], extra: dict[str, object]) -> None:
    data = {**extra, "replicas": [r.to_json() for r in replicas]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def load_replicas(path: Path) -> tuple[list[Replica], dict[str, object]]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return [], {}
    replicas = [Replica.from_json(r) for r in data.pop("replicas", [])]
    return replicas, data


def kill_all(replicas: list[Replica]) -> None:
    for replica in replicas:
        replica.signal(signal.SIGKILL)
