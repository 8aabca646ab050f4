"""One job's life on the local backend: start replicas, resize by checkpoint, retry crashes."""

from __future__ import annotations

import enum
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
PLAN_VARIABLE = "SHOAL_PLAN"  # shoal.train.apply.PLAN_VARIABLE
# Contract variables a replica must not inherit from the service's own environment.
STALE_VARIABLES = ("SHOAL_SCHEDULER_URL", "SHOAL_BATCH_SIZE", "SHOAL_MAX_LOCAL_BSZ",
                   "SHOAL_MAX_BATCH_SIZE", "SHOAL_STANDBY_FILE", PLAN_VARIABLE)


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
    # Resizes start the new replicas while the old ones train (see shoal.train.standby); the
    # old ones are stopped once the new are ready, or after this many seconds regardless.
    prewarm: bool = True
    prewarm_timeout_s: float = 120.0
    # Where serve jobs' routers listen (the service's --host) and the address they are
    # announced at (default: that host, or this machine's address when it is 0.0.0.0 / ::).
    router_host: str = "127.0.0.1"
    router_address: str | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resolve_command(command: list[str]) -> list[str]:
    """``python``/``python3`` means the interpreter shoal runs in (its virtualenv)."""
    if command and command[0] in ("python", "python3"):
        return [sys.executable, *command[1:]]
    return list(command)


def restart_losses(run_details: list[dict[str, Any]]) -> list[float]:
    """Seconds of training each run's (re)start cost the job: from the decision to its first
    step; for a resize whose old replicas trained on until they checkpointed (pre-warming), from
    that checkpoint; for a retry after a crash, from its processes' start (the decision is the
    one of the run that crashed). Runs without a first step are left out."""
    losses = []
    for i, run in enumerate(run_details):
        first = run.get("first_step")
        if first is None:
            continue
        previous = run_details[i - 1] if i else None
        since = run["requested"]
        if run.get("kind") == "retry":
            since = max(since, run.get("time", since))
        elif run.get("kind") == "resize" and previous and previous.get("checkpointed") is not None:
            since = max(since, previous["checkpointed"])
        losses.append(max(first - since, 0.0))
    return losses


def mean_restart_seconds(run_details: list[dict[str, Any]]) -> float | None:
    """What one (re)start has cost a job on average, None before its first step."""
    losses = restart_losses(run_details)
    return sum(losses) / len(losses) if losses else None


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
    # Per run, when it was asked for and how it went: "requested" (the allocation decision),
    # "time" (training processes started or promoted), "first_step" and "checkpointed" (wall
    # times the job reported), "kind" (start, resize, retry): the measured restart costs.
    run_details: list[dict[str, Any]] = field(default_factory=list)
    requested_at: float | None = None
    standby: list[Replica] = field(default_factory=list)  # pre-warmed replicas of ``target``
    standby_allocation: Allocation | None = None
    standby_since: float = 0.0
    standby_go: Path | None = None
    slot_ids: tuple[int, ...] = ()  # the pool's slots (GPU indices) the target runs on
    _resizing: bool = False
    _last_tick: float = field(default_factory=time.time)
    profiling_seconds: float = 0.0  # device time of probes on other types (Ray)

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

    @property
    def restart_seconds(self) -> float | None:
        """What one (re)start has cost this job on average, None before its first step."""
        return mean_restart_seconds(self.run_details)

    # ----- actions -----
    def set_target(self, allocation: Allocation | None, batch_size: int | None) -> None:
        if self.terminal:
            return
        if allocation != self.target:
            self.requested_at = time.time()
            # A new allocation while processes run: the next start continues a resize.
            self._resizing = allocation is not None and self.phase != Phase.IDLE
        self.target, self.target_batch = allocation, batch_size
        if self.standby and self.standby_allocation != allocation:
            self.drop_standby()
        if self.phase == Phase.RUNNING and allocation != self.running_allocation:
            if allocation is not None and self._prewarms():
                if not self.standby:
                    self._start_standby(allocation)
            else:
                self.request_stop()

    def _prewarms(self) -> bool:
        # Subclasses that start replicas their own way (Ray actors) resize by stop and start.
        return self.settings.prewarm and type(self).start is LocalJob.start

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
        self.drop_standby()
        if self.phase == Phase.RUNNING:
            self.request_stop()
        elif self.phase == Phase.IDLE:
            self._fail("cancelled")

    def _environment(self, allocation: Allocation, rank: int, port: int) -> dict[str, str]:
        env = dict(os.environ)
        for stale in STALE_VARIABLES:
            env.pop(stale, None)
        env.update(self.contract_environment(allocation, rank, port))
        return env

    def contract_environment(self, allocation: Allocation, rank: int,
                             port: int) -> dict[str, str]:
        """The replica's contract variables only (what it gets on top of the inherited ones)."""
        pool = self.settings.pool
        threads = str(pool.threads_per_slot)
        env: dict[str, str] = {}
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(allocation.num_replicas),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(allocation.num_replicas),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            SHOAL_JOB=self.name,
            SHOAL_DEVICE_TYPE=allocation.device_type,
            SHOAL_CHECKPOINT_DIR=str(self.checkpoint_dir),
            SHOAL_CHECKPOINT_INTERVAL=str(self.settings.checkpoint_interval_s),
            GLOO_SOCKET_IFNAME="lo",
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
            OMP_NUM_THREADS=threads,
            MKL_NUM_THREADS=threads,
            PYTHONUNBUFFERED="1",
        )
        if self.settings.scheduler_url:
            env["SHOAL_SCHEDULER_URL"] = self.settings.scheduler_url
        batch = self.target_batch or self._model_batch(allocation)
        if batch:
            env["SHOAL_BATCH_SIZE"] = str(batch)
        if self.spec.max_batch_size:
            env["SHOAL_MAX_BATCH_SIZE"] = str(self.spec.max_batch_size)
        local_bounds = [b for b in (self.model.max_local_bsz, self.spec.max_local_bsz) if b]
        if local_bounds:
            env["SHOAL_MAX_LOCAL_BSZ"] = str(min(local_bounds))
        if self.model.planned is not None:
            plan = self.model.plan_for(list(allocation.per_node().values()),
                                       allocation.device_type)
            if plan is None:  # policies never choose such an allocation; the script falls back
                log.warning("%s: no plan of %s fits %d %s device(s)", self.name, self.spec.model,
                            allocation.num_replicas, allocation.device_type)
            else:
                env[PLAN_VARIABLE] = json.dumps(plan.to_dict())
        if pool.gpu_ids:
            # The job's own GPUs in rank order, so LOCAL_RANK indexes them (torchrun's way).
            slots = self.slot_ids
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(pool.gpu_ids[s]) for s in slots)
        return env

    def _model_batch(self, allocation: Allocation) -> int | None:
        return self.model.best_batch(self.limits, allocation.num_nodes, allocation.num_replicas,
                                     allocation.device_type)

    def _spawn(self, allocation: Allocation, go_file: Path | None = None) -> list[Replica]:
        """Start one process per replica of ``allocation`` (as a standby when ``go_file``)."""
        for directory in (self.log_dir, self.checkpoint_dir, self.run_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.attempt += 1
        port = free_port()
        command = resolve_command(list(self.spec.command or []))
        replicas = []
        note = ", pre-warmed while the running replicas train" if go_file else ""
        for rank in range(allocation.num_replicas):
            log_path = self.log_dir / f"rank{rank}.log"
            with log_path.open("a") as handle:
                handle.write(
                    f"=== shoal: attempt {self.attempt}, {allocation.num_replicas} replica(s) "
                    f"on {allocation.device_type}{note}, {time.strftime('%H:%M:%S')} ===\n"
                )
            env = self._environment(allocation, rank, port)
            if go_file is not None:
                env["SHOAL_STANDBY_FILE"] = str(go_file)
            replicas.append(
                spawn(rank, command, env, self.workdir, log_path, self.run_dir, self.attempt)
            )
        return replicas

    def start(self, now: float) -> None:
        allocation = self.target
        assert allocation is not None and self.phase == Phase.IDLE
        self.drop_standby()
        kind = "retry" if self.crashes else ("resize" if self._resizing else "start")
        self.replicas = self._spawn(allocation)
        self._begin_run(now, allocation, kind)

    def _begin_run(self, now: float, allocation: Allocation, kind: str) -> None:
        if self.running_allocation is not None and self.running_allocation != allocation:
            self.resizes += 1
        self.running_allocation = allocation
        self.runs.append((now, allocation.num_replicas))
        self.run_details.append({
            "time": now, "replicas": allocation.num_replicas, "kind": kind,
            "requested": self.requested_at if self.requested_at is not None else now,
            "first_step": None, "checkpointed": None,
        })
        self.phase = Phase.RUNNING
        self._resizing = False
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
        if self.phase == Phase.RUNNING and self.standby:
            self._watch_standby(now)
        if self.phase == Phase.IDLE and self.cancelled:
            self._fail("cancelled")
        if self.phase == Phase.IDLE and self.target is not None and now >= self.not_before:
            if self._standby_alive() and self.standby_allocation == self.target:
                self._promote(now)
            else:
                self.start(now)

    @property
    def in_transition(self) -> bool:
        """Stopping, or pre-warming a resize: worth watching more often than once a round."""
        return self.phase == Phase.STOPPING or bool(self.standby)

    @property
    def watch_between_rounds(self) -> bool:
        """Worth a tick between rounds: in transition, or running processes whose exit is
        cheap to notice (exit files), so a finish time is exact to a fraction of a second."""
        local = type(self).tick is LocalJob.tick
        return self.in_transition or (local and self.phase == Phase.RUNNING)

    # ----- pre-warmed resizes -----
    def _start_standby(self, allocation: Allocation) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.run_dir.glob("attempt*.go*"):  # earlier resizes' signals
            stale.unlink(missing_ok=True)
        go = self.run_dir / f"attempt{self.attempt + 1}.go"
        self.standby = self._spawn(allocation, go)
        self.standby_allocation, self.standby_go = allocation, go
        self.standby_since = time.time()
        self.persist()

    def _standby_alive(self) -> bool:
        return bool(self.standby) and all(r.exit_code() is None for r in self.standby)

    def _standby_ready(self) -> bool:
        go = self.standby_go
        return go is not None and all(
            go.with_name(f"{go.name}.rank{r.rank}.ready").exists() for r in self.standby
        )

    def _watch_standby(self, now: float) -> None:
        """Stop the running replicas once the new ones are warm (or given up on)."""
        if any(r.exit_code() is not None for r in self.standby):
            log.warning("%s: a pre-warmed replica exited; resizing by a plain restart", self.name)
            self.drop_standby()
            self.request_stop()
        elif self._standby_ready() or now - self.standby_since > self.settings.prewarm_timeout_s:
            self.request_stop()

    def _promote(self, now: float) -> None:
        """The old replicas have checkpointed: let the pre-warmed ones go."""
        assert self.standby_allocation is not None and self.standby_go is not None
        self.standby_go.write_text(str(now))  # removed when the next resize starts
        self.replicas, self.standby, self.standby_go = self.standby, [], None
        allocation, self.standby_allocation = self.standby_allocation, None
        self._begin_run(now, allocation, "resize")

    def drop_standby(self) -> None:
        if not self.standby:
            return
        kill_all(self.standby)
        self.standby, self.standby_allocation = [], None
        if self.standby_go is not None:
            for path in self.standby_go.parent.glob(f"{self.standby_go.name}*"):
                path.unlink(missing_ok=True)
        self.standby_go = None

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
        self.drop_standby()
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
        self.drop_standby()
        self.phase = Phase.FINISHED
        self.finished_at = now
        self.replicas = []
        self.model.fraction = 1.0
        self.persist()

    def _fail(self, reason: str) -> None:
        self.drop_standby()
        self.phase = Phase.FAILED
        self.failed_reason = reason
        self.finished_at = time.time()
        self.persist()

    def on_report(self, report: dict[str, object]) -> None:
        self.model.update(dict(report))
        if report.get("probe"):
            return
        when = report.get("time")
        when = float(when) if isinstance(when, int | float) else time.time()
        details = self.run_details[-1] if self.run_details else None
        if report.get("checkpointed") and details is not None:
            details["checkpointed"] = when
        if report.get("done") and details is not None:
            details["done"] = when
        if self.phase == Phase.RUNNING and report.get("steps"):
            first = not self.reported_since_start
            if first and details is not None and details.get("first_step") is None:
                details["first_step"] = when
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
            "run_details": self.run_details,
            "standby": [r.to_json() for r in self.standby],
            "slot_ids": list(self.slot_ids),
            "profiling_seconds": self.profiling_seconds,
            "probe_rows": self.model.probe_rows,
        })

    def _restore_probes(self, data: dict[str, object]) -> None:
        """What probes measured on other device types (Ray), kept by a previous service."""
        self.profiling_seconds = float(data.get("profiling_seconds") or 0.0)  # type: ignore[arg-type]
        self.model.probe_rows = [r for r in data.get("probe_rows") or []  # type: ignore[union-attr]
                                 if isinstance(r, dict) and r.get("device_type")]

    def adopt(self, now: float) -> None:
        """Pick up the replicas a previous service started (they outlive it)."""
        replicas, data = load_replicas(self._run_file)
        self.attempt = int(data.get("attempt", 0) or 0)  # type: ignore[call-overload]
        self.crashes = int(data.get("crashes", 0) or 0)  # type: ignore[call-overload]
        self.resizes = int(data.get("resizes", 0) or 0)  # type: ignore[call-overload]
        self.device_seconds = float(data.get("device_seconds", 0.0) or 0.0)  # type: ignore[arg-type]
        self.runs = [(float(t), int(n)) for t, n in data.get("runs", [])]  # type: ignore[union-attr]
        self.run_details = list(data.get("run_details") or [])  # type: ignore[call-overload]
        self._restore_probes(data)
        for stale in data.get("standby") or []:  # type: ignore[union-attr]
            # A resize was being pre-warmed: those processes have trained nothing; the new
            # service decides afresh.
            Replica.from_json(stale).signal(signal.SIGKILL)  # type: ignore[arg-type]
        alloc = data.get("allocation")
        if alloc:
            dtype, nodes = alloc  # type: ignore[misc]
            self.running_allocation = Allocation(str(dtype), tuple(int(n) for n in nodes))
        self.replicas = replicas
        if replicas and data.get("phase") in (Phase.RUNNING, Phase.STOPPING):
            self.phase = Phase.RUNNING
            self.target = self.running_allocation
            # Its processes still hold these GPUs: no other job may be given them. State
            # written before slots were recorded started a job on the first GPUs.
            recorded = data.get("slot_ids")
            self.slot_ids = (tuple(int(s) for s in recorded) if recorded is not None  # type: ignore[union-attr]
                             else tuple(range(len(replicas))))
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
