"""The service's engine: the scheduler core, the local backend and the store, under one lock.

HTTP handlers and the round loop both call into :class:`Runner`; every call takes the lock,
so the core sees one caller at a time. Each round persists what changed; a restarted service
rebuilds its records from the store and re-adopts the replicas that outlived the old one.

Serve and stream jobs need no ``command``: the backend runs model servers and a router, or a
stream source and workers, for them. Their records carry service metrics (``service``:
replicas, arrival rate, SLO attainment, p99 latency, URL; for streams input rate, backlog, lag,
processed) instead of training progress, and no JCT: a service's lifetime is not a completion
time. A restarted service starts them afresh (and stops processes the old one left behind); a
stream resumes at the processed count the old one stored.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from shoal.backends.local.backend import LocalBackend
from shoal.backends.local.devices import configured_memory_gb, detect_pool
from shoal.backends.local.job import LocalJob, Phase, RunSettings, mean_restart_seconds
from shoal.backends.local.services import LocalServeJob
from shoal.core.scheduler import RoundTrigger, Scheduler
from shoal.core.state import JobRecord
from shoal.core.types import TERMINAL_STATES, Allocation, Change, JobState
from shoal.perf.efficiency import efficiency
from shoal.perf.planned import plan_summary
from shoal.policy.registry import policy_knobs, tuned_policy
from shoal.service.config import ServiceConfig
from shoal.service.explain import DecisionLog
from shoal.service.store import Store
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec

log = logging.getLogger(__name__)


class DuplicateJob(SpecError):
    pass


def _alloc_json(alloc: Allocation | None) -> list[Any] | None:
    return None if alloc is None else [alloc.device_type, list(alloc.nodes)]


def _alloc_from(data: list[Any] | None) -> Allocation | None:
    return None if not data else Allocation(str(data[0]), tuple(int(n) for n in data[1]))


def job_workdir(spec: JobSpec, submitted_from: Path) -> Path:
    """Where the job's command runs: ``spec.workdir`` (relative to ``submitted_from``) or
    ``submitted_from`` itself; a SpecError naming ``workdir`` when it is not a directory."""
    if spec.workdir is None:
        return submitted_from
    folder = (submitted_from / Path(spec.workdir).expanduser()).resolve()
    if not folder.is_dir():
        raise SpecError(f"workdir {folder} is not a directory", field="workdir")
    return folder


class Runner:
    def __init__(self, config: ServiceConfig):
        self.config = config
        self.lock = threading.RLock()
        for sub in ("logs", "checkpoints", "runs"):
            (config.home / sub).mkdir(parents=True, exist_ok=True)
        self.pool = detect_pool(config.device, config.slots, config.cores_per_slot,
                                config.slot_memory_gb)
        self.store = Store(config.database)
        settings = RunSettings(
            home=config.home,
            pool=self.pool,
            max_retries=config.max_retries,
            backoff_s=config.backoff_s,
            checkpoint_interval_s=config.checkpoint_interval_s,
            scheduler_url=config.url,
            router_host=config.host,
        )
        if config.backend == "ray":
            from shoal.backends.ray.backend import RayBackend
            from shoal.backends.ray.job import RaySettings

            settings = RaySettings(**vars(settings), checkpoint_root=config.checkpoint_dir,
                                   device_memory_gb=configured_memory_gb(config.slot_memory_gb))
            self.backend = RayBackend(settings, config.ray_address)
        else:
            self.backend = LocalBackend(settings)
        policy = tuned_policy(config.policy, config.knobs, config.restart_delay_s)
        self.scheduler = Scheduler(policy, self.backend)
        self.workdirs: dict[str, Path] = {}
        self.seq: dict[str, int] = {}
        self._saved_events = 0
        self._saved_terminal: set[str] = set()
        self.decisions = DecisionLog()  # why each job holds what it holds
        self._stop = threading.Event()
        self._arrived = threading.Event()  # wakes the loop early for policies that want it
        self._thread: threading.Thread | None = None
        self.started_at = time.time()
        self._recover()

    # ----- recovery -----
    def _recover(self) -> None:
        for row in self.store.jobs():
            spec = JobSpec.model_validate(row.spec)
            record = JobRecord(
                spec,
                state=JobState(row.state),
                batch_size=row.batch_size,
                start_time=row.start_time,
                finish_time=row.finish_time,
                failure=row.failure,
                num_starts=row.num_starts,
                device_seconds=row.device_seconds,
                history=[(t, _alloc_from(a)) for t, a in row.history],
            )
            self.scheduler.records[spec.name] = record
            self.workdirs[spec.name] = Path(row.workdir)
            self.seq[spec.name] = row.seq
            if not record.active:
                self._saved_terminal.add(spec.name)
                continue
            if spec.kind != "train":
                self._recover_service(record, row.summary or {})
                continue
            limits = self.backend.base_limits(spec)
            job = self.backend.adopt(spec, Path(row.workdir), limits)
            record.limits = job.limits
            if job.phase == Phase.RUNNING:
                record.allocation = job.running_allocation
                record.state = JobState.RUNNING
            else:
                record.allocation = None
                record.state = JobState.PENDING
            log.info("recovered %s as %s (%s)", spec.name, record.state, job.phase)

    def _recover_service(self, record: JobRecord, summary: dict[str, Any]) -> None:
        """A service starts afresh: stop what the old service left running, admit it again (a
        stream job resumes at the count of samples it had processed)."""
        for pid in (summary.get("service") or {}).get("pids") or []:
            _stop_leftover(int(pid))
        record.allocation = None
        try:
            record.limits = self.backend.admit(record.spec)
        except SpecError as exc:  # e.g. restarted on a machine of another device type
            now = self.backend.now()
            record.failure, record.finish_time = f"rejected after restart: {exc}", now
            record.transition(JobState.FAILED, now, self.scheduler.events, record.failure)
            return
        service = self._service(record.name)
        if service is not None:
            service.resume(summary.get("service") or {})
        if record.state != JobState.PENDING:
            record.transition(JobState.PENDING, self.backend.now(), self.scheduler.events,
                              "service restarted")
        log.info("recovered service %s as pending", record.name)

    # ----- user actions -----
    def validate(self, spec: JobSpec) -> None:
        if spec.name in self.scheduler.records:
            raise DuplicateJob(
                f"a job named '{spec.name}' already exists; choose another name", field="name"
            )
        if spec.kind != "train":
            if not isinstance(self.backend, LocalBackend):
                raise SpecError(f"this service's backend runs training jobs; a {spec.kind} job "
                                "runs on the local backend (shoal up --backend local)",
                                field="kind")
            if spec.command:
                raise SpecError(f"a {spec.kind} job runs shoal's built-in model, not a "
                                "program: remove command", field="command")
            self.backend.check_service(spec)
            return
        if not spec.command:
            raise SpecError(
                "the local backend runs a program: add e.g. command: [\"python\", \"train.py\"]",
                field="command",
            )
        if spec.model is not None and isinstance(self.backend, LocalBackend):
            self.backend.plan_model(spec)  # refuses a model no allocation here can hold

    def submit(self, spec: JobSpec, workdir: Path | None = None) -> dict[str, Any]:
        with self.lock:
            self.validate(spec)
            folder = job_workdir(spec, Path(workdir or Path.cwd()))
            now = self.backend.now()
            spec = spec.model_copy(update={"submit_time": now})
            self.backend.pending_workdir = folder
            self.workdirs[spec.name] = self.backend.pending_workdir
            self.seq[spec.name] = max(self.seq.values(), default=-1) + 1
            record = self.scheduler.submit(spec)
            self._persist()
            if self.scheduler.policy.decides_on_arrival:
                self._arrived.set()
            return self.describe(record)

    def cancel(self, name: str) -> dict[str, Any]:
        with self.lock:
            record = self.scheduler.cancel(name)
            self.backend.cancel(name)
            self._persist()
            return self.describe(record)

    def report(self, name: str, payload: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            record = self.scheduler.records.get(name)
            if record is None or not record.active:
                raise KeyError(name)
            return self.backend.report(name, payload)

    # ----- the loop -----
    def round(self, trigger: RoundTrigger = "interval") -> None:
        with self.lock:
            self._drop_lost_nodes()
            for name, limits in self.backend.learned_limits().items():
                record = self.scheduler.records.get(name)
                if record is not None and record.active:
                    record.limits = limits
            self.scheduler.round(trigger)
            try:
                self.decisions.note(self.scheduler, self.backend.now())
            except Exception:  # an explanation never stops a round from being saved
                log.exception("explaining the round failed")
            self._persist()

    def _drop_lost_nodes(self) -> None:
        """Re-read a changing cluster (Ray); jobs on nodes that left lose their allocation and
        stop, and the round places them again on what is left (they resume from checkpoints)."""
        refresh = getattr(self.backend, "refresh", None)
        if refresh is None:
            return
        alive = {n.node_id for n in refresh().nodes}
        now = self.backend.now()
        lost = []
        for record in self.scheduler.records.values():
            alloc = record.allocation
            if record.active and alloc is not None and not set(alloc.nodes) <= alive:
                record.allocation = None
                record.history.append((now, None))
                record.transition(JobState.PENDING, now, self.scheduler.events, "node lost")
                lost.append(Change(record.name, None))
        if lost:
            log.warning("nodes left the cluster; re-placing %s", [c.job for c in lost])
            self.backend.apply(lost)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="shoal-rounds", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        trigger = "interval"
        next_round = time.monotonic()
        while not self._stop.is_set():
            try:
                self.round(trigger)
            except Exception:  # keep scheduling; the traceback is in the service log
                log.exception("scheduling round failed")
            if trigger == "interval":
                next_round = time.monotonic() + self.config.interval_s
            trigger = self._between_rounds(next_round)

    def _between_rounds(self, next_round: float, every_s: float = 0.1) -> RoundTrigger:
        """Until the next round, let the backend move resizes along (process exits, warm
        replicas) every ``every_s`` seconds, so a resize does not wait for a round. Returns
        early, with "arrival" / "completion", when a job arrived / ended for a policy that
        decides on arrival / completion."""
        poll = getattr(self.backend, "poll", None)
        on_completion = getattr(self.scheduler.policy, "decides_on_completion", False)
        while not self._stop.is_set():
            if self._arrived.is_set():
                self._arrived.clear()
                return "arrival"
            left = next_round - time.monotonic()
            if left <= 0:
                return "interval"
            self._stop.wait(min(every_s, left))
            if poll is not None:
                try:
                    with self.lock:
                        ended = poll()
                except Exception:
                    log.exception("polling the backend failed")
                    continue
                if ended and on_completion:
                    return "completion"
        return "interval"

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop the loop, checkpoint every running job (they resume at the next start)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self.lock:
            self.backend.stop_all(timeout_s)
            self.scheduler.observe()
            for record in self.scheduler.records.values():
                if record.active and record.allocation is not None:
                    job = self.backend.jobs.get(record.name)
                    if job is not None and job.phase != Phase.RUNNING:
                        record.allocation = None
                        record.transition(JobState.PENDING, self.backend.now(),
                                          self.scheduler.events, "service stopped")
            self._persist()
            self.store.close()
            close = getattr(self.backend, "close", None)
            if close is not None:
                close()

    # ----- persistence -----
    def _persist(self) -> None:
        rows = []
        for record in self.scheduler.records.values():
            if record.name in self._saved_terminal:
                continue
            rows.append(self._row(record))
            if record.state in TERMINAL_STATES:
                self._saved_terminal.add(record.name)
        if rows:
            self.store.save_jobs(rows)
        events = self.scheduler.events[self._saved_events:]
        if events:
            self.store.add_events((e.time, e.job, e.kind, e.detail) for e in events)
            self._saved_events = len(self.scheduler.events)

    def _row(self, record: JobRecord) -> dict[str, Any]:
        job = self.backend.jobs.get(record.name)
        return {
            "name": record.name,
            "seq": self.seq.get(record.name, 0),
            "spec": record.spec.model_dump(mode="json"),
            "workdir": str(self.workdirs.get(record.name, Path.cwd())),
            "state": str(record.state),
            "submit_time": record.spec.submit_time,
            "start_time": record.start_time,
            "finish_time": record.finish_time,
            "failure": record.failure,
            "batch_size": record.batch_size,
            "allocation": _alloc_json(record.allocation),
            "history": [[t, _alloc_json(a)] for t, a in record.history],
            "num_starts": record.num_starts,
            "device_seconds": record.device_seconds,
            "summary": self._job_summary(record, job),
        }

    # ----- views -----
    def _service(self, name: str) -> LocalServeJob | None:
        return getattr(self.backend, "services", {}).get(name)

    def _job_summary(self, record: JobRecord, job: LocalJob | None) -> dict[str, Any]:
        service = self._service(record.name)
        if service is not None:
            return {"service": _service_metrics(service), "resizes": service.resizes,
                    "crashes": service.crashes}
        if job is None:
            return self._stored(record)
        summary = job.model.summary()
        summary.update(
            resizes=job.resizes,
            runs=[{"time": t, "replicas": n} for t, n in job.runs],
            run_details=list(getattr(job, "run_details", [])),
            phase=str(job.phase),
            crashes=job.crashes,
            attempt=job.attempt,
            replica_pids=[r.pid for r in job.replicas],
            goodput=self._goodput(job),
        )
        alloc = job.running_allocation
        plan = job.model.plan_for(list(alloc.per_node().values())) if alloc else None
        if plan is not None:  # a job that declares its model: the plan its last run got
            summary["plan"] = plan_summary(plan)
        return summary

    @staticmethod
    def _goodput(job: LocalJob) -> float | None:
        """Samples per second times statistical efficiency at the batch in use."""
        model, limits = job.model, job.limits
        if model.grad is None or not model.batch_size or not model.samples_per_second:
            return model.samples_per_second or None
        eff = float(efficiency(model.grad, model.batch_size, limits.init_batch_size))
        return model.samples_per_second * eff

    def _stored(self, record: JobRecord) -> dict[str, Any]:
        for row in self.store.jobs():
            if row.name == record.name:
                return dict(row.summary or {})
        return {}

    def describe(self, record: JobRecord, stored: dict[str, Any] | None = None) -> dict[str, Any]:
        job = self.backend.jobs.get(record.name)
        live = job is not None or self._service(record.name) is not None
        summary = stored if not live and stored is not None else self._job_summary(record, job)
        alloc = record.allocation
        end = record.finish_time
        service = record.spec.kind != "train"
        return {
            **{k: v for k, v in summary.items() if k != "batch_size"},
            "name": record.name,
            "kind": record.spec.kind,
            "state": str(record.state),
            "tenant": record.spec.tenant,
            "application": record.spec.application,
            "submit_time": record.spec.submit_time,
            "start_time": record.start_time,
            "finish_time": end,
            "jct": None if end is None or service else end - record.spec.submit_time,
            "queued_seconds": None if service else record.queued_seconds(self.backend.now()),
            "failure": record.failure,
            "allocation": None if alloc is None else {
                "device_type": alloc.device_type, "replicas": alloc.num_replicas,
                "nodes": list(alloc.nodes),
            },
            "history": [
                {"time": t, "replicas": 0 if a is None else a.num_replicas,
                 "device_type": None if a is None else a.device_type}
                for t, a in record.history
            ],
            "batch_size": record.batch_size,
            "num_restarts": record.num_restarts,
            "restart_seconds": record.restart_seconds if record.restart_seconds is not None
            # A finished job a restarted service has not observed: from its stored runs.
            else mean_restart_seconds(summary.get("run_details") or []),
            "device_seconds": record.device_seconds,
            "profiling_seconds": record.profiling_seconds,
            "workdir": str(self.workdirs.get(record.name, "")),
            "spec": record.spec.model_dump(mode="json"),
            "decision": self.decisions.latest.get(record.name),
        }

    def jobs(self) -> list[dict[str, Any]]:
        with self.lock:
            records = sorted(self.scheduler.records.values(), key=lambda r: self.seq.get(r.name, 0))
            stored = {row.name: dict(row.summary or {}) for row in self.store.jobs()}
            return [self.describe(r, stored.get(r.name, {})) for r in records]

    def job(self, name: str) -> dict[str, Any]:
        with self.lock:
            return self.describe(self.scheduler.records[name])

    def cluster(self) -> dict[str, Any]:
        with self.lock:
            used: dict[int, list[str]] = {}
            for record in self.scheduler.records.values():
                if record.allocation is not None and record.active:
                    for node in record.allocation.nodes:
                        used.setdefault(node, []).append(record.name)
            nodes = [
                {"node_id": n.node_id, "device_type": n.device_type, "capacity": n.capacity,
                 "used": len(used.get(n.node_id, [])), "jobs": used.get(n.node_id, [])}
                for n in self.backend.cluster().nodes
            ]
            pool = self.backend.pool
            return {
                "pool": pool.describe(),
                "device_type": pool.device_type,
                "threads_per_slot": pool.threads_per_slot,
                "nodes": nodes,
                "policy": self.scheduler.policy.name,
                "interval_s": self.config.interval_s,
                "restart_delay_s": getattr(self.scheduler.policy, "restart_delay", None),
                "knobs": policy_knobs(self.scheduler.policy),
                "rounds": len(self.scheduler.rounds),
            }

    def events(self, job: str | None, after_id: int,
               last: int | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {"id": e.id, "time": e.time, "job": e.job, "kind": e.kind, "detail": e.detail}
                for e in self.store.events(job, after_id, last=last)
            ]

    def log_path(self, name: str, rank: int) -> Path:
        with self.lock:
            if name not in self.scheduler.records:
                raise KeyError(name)
        return self.config.home / "logs" / name / f"rank{rank}.log"


def _service_metrics(service: LocalServeJob) -> dict[str, Any]:
    """What ``shoal show`` / ``ls`` and the API report for a serve or stream job (from its last
    round)."""
    metrics = service.metrics
    if service.spec.kind == "stream":
        keys = ("input_rate", "backlog", "lag_s", "max_lag_s", "processed", "lag_bound_s",
                "device_type", "device_speed")
        return {"kind": "stream", "url": service.url,
                "replicas": len(service.ready) if not service.terminal else 0,
                **{key: metrics.get(key) for key in keys},
                "device_seconds": service.device_seconds, "pids": service.pids}
    return {
        "kind": service.spec.kind,
        "url": service.url,
        "replicas": len(service.ready) if not service.terminal else 0,
        "arrival_rate": metrics.get("arrival_rate"),
        "requests": metrics.get("requests", 0),
        "slo_s": service.spec.serve.slo_s if service.spec.serve is not None else None,
        "slo_attainment": metrics.get("slo_attainment"),
        "p99_latency_s": metrics.get("p99_latency_s"),
        "device_seconds": service.device_seconds,
        "pids": service.pids,
    }


def _stop_leftover(pid: int) -> None:
    """SIGTERM a model server or router a killed service left behind (checked by command line,
    so a recycled pid is left alone)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return
    if b"shoal.serve." in cmdline:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
            log.info("stopped process %d left by the previous service", pid)
