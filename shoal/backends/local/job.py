"""One job's life on the local backend: start replicas, resize by checkpoint, retry crashes."""

from __future__ import annotations

import enum
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.backends.local.devices import DevicePool
from shoal.backends.local.model import JobModel
from shoal.backends.local.replicas import (
    Replica,
    kill_all,
    load_replicas,
    save_replicas,
    spawn,
)
from shoal.core.types import Allocation, JobLimits
from shoal.spec.job import JobSpec

log = logging.getLogger(__name__)

EXIT_CHECKPOINTED = 3  # shoal.train.EXIT_CHECKPOINTED; not imported to keep torch out


class Phase(enum.StrEnum):
    IDLE = "idle"  # no processes; starts when it has a target allocation
    RUNNING = "running"
    STOPPING = "stopping"  # asked to checkpoint and exit
    FINISHED = "finished"
    FAILED = "failed"


@dataclass
class RunSettings:
    home: Path
    pool: DevicePool
    max_retries: int = 3
    backoff_s: float = 2.0
    stop_timeout_s: float = 60.0
    checkpoint_interval_s: float = 30.0
    scheduler_url: str | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resolve_command(command: list[str]) -> list[str]:
    """``python``/``python3`` means the interpreter shoal runs in (its virtualenv)."""
    if command and command[0] in ("python", "python3"):
        return [sys.executable, *command[1:]]
    return list(command)


@dataclass
class LocalJob:
    spec: JobSpec
    workdir: Path
    base_limits: JobLimits
    settings: RunSettings
    model: JobModel
    phase: Phase = Phase.IDLE
    target: Allocation | None = None
    target_batch: int | None = None
    running_allocation: Allocation | None = None
    replicas: list[Replica] = field(default_factory=list)
    attempt: int = 0
    crashes: int = 0  # consecutive; reset once a restarted run reports progress
    not_before: float = 0.0
    device_seconds: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    failed_reason: str | None = None
    cancelled: bool = False
    reported_since_start: bool = False
    stop_deadline: float = 0.0
    resizes: int = 0
    runs: list[tuple[float, int]] = field(default_factory=list)  # (start time, replicas)
    _last_tick: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def log_dir(self) -> Path:
        return self.settings.home / "logs" / self.name

    @property
    def checkpoint_dir(self) -> Path:
        return self.settings.home / "checkpoints" / self.name

    @property
    def run_dir(self) -> Path:
        return self.settings.home / "runs" / self.name

    @property
    def limits(self) -> JobLimits:
        return self.model.limits(self.base_limits)

    @property
    def terminal(self) -> bool:
        return self.phase in (Phase.FINISHED, Phase.FAILED)

    # ----- actions -----
    def set_target(self, allocation: Allocation | None, batch_size: int | None) -> None:
        if self.terminal:
            return
        self.target, self.target_batch = allocation, batch_size
        if self.phase == Phase.RUNNING and allocation != self.running_allocation:
            self.request_stop()

    def request_stop(self) -> None:
        if self.phase != Phase.RUNNING:
            return
        self.phase = Phase.STOPPING
        self.stop_deadline = time.time() + self.settings.stop_timeout_s
        for replica in self.replicas:
            replica.signal(signal.SIGTERM)

    def cancel(self) -> None:
        self.cancelled = True
        self.target = None
        if self.phase == Phase.RUNNING:
            self.request_stop()
        elif self.phase == Phase.IDLE:
            self._fail("cancelled")

    def _environment(self, allocation: Allocation, rank: int, port: int) -> dict[str, str]:
        pool = self.settings.pool
        threads = str(pool.threads_per_slot)
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(allocation.num_replicas),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(allocation.num_replicas),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            SHOAL_JOB=self.name,
            SHOAL_CHECKPOINT_DIR=str(self.checkpoint_dir),
            SHOAL_CHECKPOINT_INTERVAL=str(self.settings.checkpoint_interval_s),
            GLOO_SOCKET_IFNAME="lo",
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
            OMP_NUM_THREADS=threads,
            MKL_NUM_THREADS=threads,
            PYTHONUNBUFFERED="1",
        )
        for stale in ("SHOAL_SCHEDULER_URL", "SHOAL_BATCH_SIZE", "SHOAL_MAX_LOCAL_BSZ"):
            env.pop(stale, None)
        if self.settings.scheduler_url:
            env["SHOAL_SCHEDULER_URL"] = self.settings.scheduler_url
        batch = self.target_batch or self._model_batch(allocation)
        if batch:
            env["SHOAL_BATCH_SIZE"] = str(batch)
        if self.model.max_local_bsz:
            env["SHOAL_MAX_LOCAL_BSZ"] = str(self.model.max_local_bsz)
        if pool.gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(pool.gpu_ids[i]) for i in range(
                allocation.num_replicas))
        return env

    def _model_batch(self, allocation: Allocation) -> int | None:
        return self.model.best_batch(self.limits, allocation.num_nodes, allocation.num_replicas)

    def start(self, now: float) -> None:
        allocation = self.target
        assert allocation is not None and self.phase == Phase.IDLE
        for directory in (self.log_dir, self.checkpoint_dir, self.run_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.attempt += 1
        port = free_port()
        command = resolve_command(list(self.spec.command or []))
        self.replicas = []
        for rank in range(allocation.num_replicas):
            log_path = self.log_dir / f"rank{rank}.log"
            with log_path.open("a") as handle:
                handle.write(
                    f"=== shoal: attempt {self.attempt}, {allocation.num_replicas} replica(s) "
                    f"on {allocation.device_type}, {time.strftime('%H:%M:%S')} ===\n"
                )
            env = self._environment(allocation, rank, port)
            self.replicas.append(
                spawn(rank, command, env, self.workdir, log_path, self.run_dir, self.attempt)
            )
        if self.running_allocation is not None and self.running_allocation != allocation:
            self.resizes += 1
        self.running_allocation = allocation
        self.runs.append((now, allocation.num_replicas))
        self.phase = Phase.RUNNING
        self.reported_since_start = False
        if self.started_at is None:
            self.started_at = now
        self._last_tick = now
        self.persist()

    # ----- observation -----
    def tick(self, now: float) -> None:
        """Account device time, collect exits and start what is due."""
        if self.phase in (Phase.RUNNING, Phase.STOPPING) and self.running_allocation:
            self.device_seconds += (now - self._last_tick) * self.running_allocation.num_replicas
        self._last_tick = now
        if self.phase in (Phase.RUNNING, Phase.STOPPING):
            self._collect(now)
        if self.phase == Phase.IDLE and self.cancelled:
            self._fail("cancelled")
        if self.phase == Phase.IDLE and self.target is not None and now >= self.not_before:
            self.start(now)

    def _collect(self, now: float) -> None:
        codes = [r.exit_code() for r in self.replicas]
        done = [c for c in codes if c is not None]
        if self.phase == Phase.STOPPING:
            if len(done) < len(codes):
                if now > self.stop_deadline:
                    log.warning("%s: replicas ignored the stop request; killing them", self.name)
                    kill_all(self.replicas)
                return
            if all(c == 0 for c in codes):
                self._finish(now)
            else:
                self._to_idle(now)
            return
        bad = [(r.rank, c) for r, c in zip(self.replicas, codes, strict=True)
               if c is not None and c not in (0, EXIT_CHECKPOINTED)]
        if bad:
            kill_all(self.replicas)
            self._crash(now, bad)
            return
        if len(done) < len(codes):
            return
        if all(c == 0 for c in codes):
            self._finish(now)
        else:  # every replica checkpointed on its own request (e.g. a .resize file)
            self._to_idle(now)

    def _to_idle(self, now: float) -> None:
        self.phase = Phase.IDLE
        self.replicas = []
        self.persist()
        if self.cancelled:
            self._fail("cancelled")

    def _crash(self, now: float, bad: list[tuple[int, int]]) -> None:
        self.crashes += 1
        what = ", ".join(f"rank {rank} exited with {_describe(code)}" for rank, code in bad)
        tail = self._log_tail(bad[0][0])
        if self.crashes > self.settings.max_retries:
            self.replicas = []
            self._fail(f"{what}; gave up after {self.settings.max_retries} restarts. {tail}")
            return
        delay = self.settings.backoff_s * 2 ** (self.crashes - 1)
        log.warning("%s: %s; restart %d in %.0f s", self.name, what, self.crashes, delay)
        self.not_before = now + delay
        self._to_idle(now)

    def _log_tail(self, rank: int, lines: int = 3) -> str:
        try:
            text = (self.log_dir / f"rank{rank}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""
        last = [line for line in text.splitlines() if line.strip()][-lines:]
        return "last log lines: " + " | ".join(last) if last else ""

    def _finish(self, now: float) -> None:
        self.phase = Phase.FINISHED
        self.finished_at = now
        self.replicas = []
        self.model.fraction = 1.0
        self.persist()

    def _fail(self, reason: str) -> None:
        self.phase = Phase.FAILED
        self.failed_reason = reason
        self.finished_at = time.time()
        self.persist()

    def on_report(self, report: dict[str, object]) -> None:
        self.model.update(dict(report))
        if self.phase == Phase.RUNNING and report.get("steps"):
            self.reported_since_start = True
            self.crashes = 0

    # ----- persistence of the processes, for a restarted service -----
    @property
    def _run_file(self) -> Path:
        return self.run_dir / "run.json"

    def persist(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        alloc = self.running_allocation
        save_replicas(self._run_file, self.replicas, {
            "attempt": self.attempt,
            "phase": str(self.phase),
            "allocation": None if alloc is None else [alloc.device_type, list(alloc.nodes)],
            "crashes": self.crashes,
            "resizes": self.resizes,
            "device_seconds": self.device_seconds,
            "runs": self.runs,
        })

    def adopt(self, now: float) -> None:
        """Pick up the replicas a previous service started (they outlive it)."""
        replicas, data = load_replicas(self._run_file)
        self.attempt = int(data.get("attempt", 0) or 0)  # type: ignore[call-overload]
        self.crashes = int(data.get("crashes", 0) or 0)  # type: ignore[call-overload]
        self.resizes = int(data.get("resizes", 0) or 0)  # type: ignore[call-overload]
        self.device_seconds = float(data.get("device_seconds", 0.0) or 0.0)  # type: ignore[arg-type]
        self.runs = [(float(t), int(n)) for t, n in data.get("runs", [])]  # type: ignore[union-attr]
        alloc = data.get("allocation")
        if alloc:
            dtype, nodes = alloc  # type: ignore[misc]
            self.running_allocation = Allocation(str(dtype), tuple(int(n) for n in nodes))
        self.replicas = replicas
        if replicas and data.get("phase") in (Phase.RUNNING, Phase.STOPPING):
            self.phase = Phase.RUNNING
            self.target = self.running_allocation
            self._last_tick = now
            log.info("%s: adopted %d replica(s) of attempt %d", self.name, len(replicas),
                     self.attempt)
        else:
            self.replicas = []
            self.phase = Phase.IDLE


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
