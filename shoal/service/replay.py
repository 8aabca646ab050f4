"""Replay a real run in the simulator: its measured profiles, its workload, its restart costs.

The local service and the simulator drive the same scheduler core and policies; what differs is
where step times and gradient statistics come from. :func:`export_run` turns what the real jobs
reported to the service (``GET /api/jobs``, ``GET /api/cluster``) into the simulator's inputs:

* a profile directory in the format of :mod:`shoal.backends.sim.profile`, one application per
  job: ``placements-<type>.csv`` with the measured step and sync time of every configuration the
  job ran, and for the configurations it never ran, the prediction of the throughput model
  fitted to those measurements (what the scheduler itself believed); ``validation-<B>.csv`` for
  the initial and the largest batch size with the job's per-epoch trace (progress, gradient
  statistics);
* the workload: each job's spec with its submission time relative to the first one;
* the restart costs measured on the run: seconds from an allocation decision to the first step
  of a cold start, and for a resize how long the old replicas kept training (pre-warming) and
  how long the job then trained nowhere;
* the cluster (one node of the pool's slots), the policy, the round interval.

:func:`simulate_run` replays it and :func:`compare` sets the JCTs side by side.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shoal.spec.cluster import ClusterSpec, DeviceType, NodeGroup
from shoal.spec.job import JobSpec

PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time", "source")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
VALIDATION_COLUMNS = ("progress", "iteration", "metric", "grad_sqr", "grad_var")
_SPEC_FIELDS = ("tenant", "weight", "min_replicas", "max_replicas", "num_replicas",
                "adaptive_batch", "rigid", "preemptible")


@dataclass
class RestartCosts:
    """Seconds, averaged over the run (``count_*``: how many events each mean rests on)."""

    start_delay: float  # allocation decision -> first step, starting from no processes
    resize_overlap: float  # resize decision -> old replicas' checkpoint (they keep training)
    restart_delay: float  # old replicas' checkpoint -> first step of the new ones
    finish_delay: float  # last step ("done" report) -> the job's processes have exited
    count_starts: int = 0
    count_resizes: int = 0
    count_finishes: int = 0


@dataclass
class MeasuredRun:
    profiles: Path
    jobs: list[JobSpec]
    cluster: ClusterSpec
    policy: str
    interval_s: float
    policy_restart_delay: float | None
    costs: RestartCosts
    policy_knobs: dict[str, Any] = field(default_factory=dict)  # shoal knobs the run changed
    real_jct: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MeasuredRun:
        """The run :meth:`to_json` wrote (``run.json`` beside the exported profiles)."""
        return cls(
            profiles=Path(data["profiles"]),
            jobs=[JobSpec(**job) for job in data["jobs"]],
            cluster=ClusterSpec(**data["cluster"]),
            policy=str(data["policy"]),
            interval_s=float(data["interval_s"]),
            policy_restart_delay=data.get("policy_restart_delay"),
            costs=RestartCosts(**data["costs"]),
            policy_knobs=dict(data.get("policy_knobs") or {}),
            real_jct={k: float(v) for k, v in (data.get("real_jct") or {}).items()},
            notes=list(data.get("notes") or []),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "profiles": str(self.profiles),
            "jobs": [j.model_dump(mode="json", exclude_defaults=True) for j in self.jobs],
            "cluster": self.cluster.model_dump(mode="json"),
            "policy": self.policy,
            "interval_s": self.interval_s,
            "policy_restart_delay": self.policy_restart_delay,
            "policy_knobs": self.policy_knobs,
            "costs": asdict(self.costs),
            "real_jct": self.real_jct,
            "notes": self.notes,
        }


# ----- step times ---------------------------------------------------------------------------
def _placement(nodes: int, replicas: int) -> str:
    """Replicas per node as the simulator's digit string (spread as evenly as possible)."""
    base, extra = divmod(replicas, nodes)
    counts = [base + (1 if n < extra else 0) for n in range(nodes)]
    if max(counts) > 9:
        raise ValueError(f"{replicas} replicas on {nodes} node(s) do not fit a placement id")
    return "".join(str(c) for c in counts if c)


Config = tuple[int, int, int]  # (nodes, replicas, micro-batch)


def measured_steps(rows: Iterable[dict[str, Any]]) -> dict[Config, tuple[float, float]]:
    """(nodes, replicas, micro-batch) -> (step, sync) of one synchronising micro-step.

    A configuration with ``accum_steps`` extra micro-steps took ``step_time``; its micro-step
    compute is ``(step_time - sync_time) / (accum_steps + 1)``, and the simulator's step is
    compute + sync, so that ``step + (step - sync) * accum_steps`` gives the measured time back.
    Rows of the same configuration are averaged, weighted by their step counts.
    """
    sums: dict[Config, list[float]] = {}
    for row in rows:
        count = float(row.get("count") or 0)
        step_time, sync_time = float(row["step_time"]), float(row["sync_time"])
        if count <= 0 or step_time <= 0:
            continue
        accum = int(row["accum_steps"])
        compute = max((step_time - sync_time) / (accum + 1), 1e-6)
        key = (int(row["num_nodes"]), int(row["num_replicas"]), int(row["local_bsz"]))
        acc = sums.setdefault(key, [0.0, 0.0, 0.0])
        acc[0] += count * (compute + sync_time)
        acc[1] += count * sync_time
        acc[2] += count
    return {k: (v[0] / v[2], v[1] / v[2]) for k, v in sums.items()}


def _batch_grid(largest: int, measured: Iterable[int]) -> list[int]:
    grid = {1, largest, *measured}
    size = 2
    while size < largest:
        grid.add(size)
        size *= 2
    return sorted(b for b in grid if 1 <= b <= largest)


def placement_rows(
    rows: list[dict[str, Any]], max_replicas: int, max_local_bsz: int, per_node: int
) -> list[dict[str, Any]]:
    """Every (placement, micro-batch) the simulator may ask for: measured, else predicted."""
    from shoal.perf.throughput import fit_perf_params, predict_grad_time, predict_step_time

    measured = measured_steps(rows)
    if not measured:
        raise ValueError("the job reported no step times")
    keys = list(measured)
    values = np.array([measured[k] for k in keys])
    perf = fit_perf_params(
        [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
        values[:, 0] - values[:, 1], values[:, 0],
    )
    out = []
    grid = _batch_grid(max_local_bsz, (k[2] for k in keys))
    for replicas in range(1, max_replicas + 1):
        nodes = math.ceil(replicas / per_node)
        for bsz in grid:
            hit = measured.get((nodes, replicas, bsz))
            if hit is not None:
                step, sync, source = hit[0], hit[1], "measured"
            else:
                step = float(predict_step_time(perf, nodes, replicas, bsz))
                sync = max(step - float(predict_grad_time(perf, bsz)), 0.0)
                source = "model"
            out.append({"placement": _placement(nodes, replicas), "local_bsz": bsz,
                        "step_time": step, "sync_time": sync, "source": source})
    return out


# ----- statistical progress -------------------------------------------------------------------
def validation_rows(trace: list[dict[str, Any]], init_batch: int,
                    batch_size: int) -> list[dict[str, Any]]:
    """Per finished epoch: scale-invariant progress in iterations at the initial batch size,
    iterations at ``batch_size``, and the gradient statistics measured at the epoch's end."""
    if not trace:
        raise ValueError("the job reported no finished epoch")
    known = [(r.get("grad_sqr"), r.get("grad_var")) for r in trace]
    first = next(((s, v) for s, v in known if s is not None and v is not None), (1.0, 0.0))
    out, previous_samples, iterations, stats = [], 0, 0, first
    for row in trace:
        if row.get("grad_sqr") is not None and row.get("grad_var") is not None:
            stats = (float(row["grad_sqr"]), float(row["grad_var"]))
        samples = int(row["samples"]) - previous_samples
        previous_samples = int(row["samples"])
        iterations += math.ceil(samples / batch_size)
        out.append({"progress": float(row["progress"]) / init_batch, "iteration": iterations,
                    "metric": float("nan"), "grad_sqr": stats[0], "grad_var": stats[1]})
    return out


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


# ----- restart costs ------------------------------------------------------------------------
def restart_costs(jobs: list[dict[str, Any]]) -> RestartCosts:
    """Means over the run. Without a completed resize, one is taken to cost what pre-warming
    does at best: the old allocation trains for a start delay, then the new one at once."""
    starts, overlaps, pauses, finishes = [], [], [], []
    for job in jobs:
        details = job.get("run_details") or []
        if details and details[-1].get("done") is not None and job.get("finish_time"):
            finishes.append(max(float(job["finish_time"]) - details[-1]["done"], 0.0))
        for i, run in enumerate(details):
            first = run.get("first_step")
            if first is None:
                continue
            previous = details[i - 1] if i else None
            if run.get("kind") == "start" or previous is None:
                starts.append(first - run["requested"])
            elif run.get("kind") == "resize" and previous.get("checkpointed") is not None:
                overlaps.append(max(previous["checkpointed"] - run["requested"], 0.0))
                pauses.append(max(first - previous["checkpointed"], 0.0))
    if not starts:
        raise ValueError("no job of the run reported its first step")
    start = statistics.fmean(starts)
    return RestartCosts(
        start_delay=start,
        resize_overlap=statistics.fmean(overlaps) if overlaps else start,
        restart_delay=statistics.fmean(pauses) if pauses else 0.0,
        finish_delay=statistics.fmean(finishes) if finishes else 0.0,
        count_starts=len(starts),
        count_resizes=len(pauses),
        count_finishes=len(finishes),
    )


# ----- the whole run ------------------------------------------------------------------------
def export_run(jobs: list[dict[str, Any]], cluster: dict[str, Any], out: Path) -> MeasuredRun:
    """Write the profiles of the finished jobs under ``out`` and describe the run to replay.

    ``jobs`` and ``cluster`` are the service's ``GET /api/jobs`` and ``GET /api/cluster``.
    """
    out.mkdir(parents=True, exist_ok=True)
    dtype = str(cluster["device_type"])
    if len(cluster["nodes"]) != 1:
        raise ValueError("replaying needs a one-node pool (the local backend's)")
    per_node = int(cluster["nodes"][0]["capacity"])
    finished = [j for j in jobs if j["state"] == "finished"]
    notes = [f"{j['name']}: {j['state']}, not replayed" for j in jobs if j["state"] != "finished"]
    if not finished:
        raise ValueError("no finished job to replay")
    t0 = min(float(j["submit_time"]) for j in finished)
    specs, real = [], {}
    for job in finished:
        name = job["name"]
        bounds = job.get("bounds") or {}
        trace = job.get("epochs") or []
        init = int(bounds.get("init_batch_size") or job["spec"].get("batch_size") or 1)
        max_batch = int(bounds.get("max_batch_size") or job["spec"].get("max_batch_size") or init)
        max_local = int(bounds.get("max_local_bsz") or max_batch)
        max_replicas = min(per_node, int(job["spec"].get("max_replicas") or per_node))
        try:
            profile = [r for r in job.get("profile") or [] if r.get("device_type", dtype) == dtype]
            steps = placement_rows(profile, max_replicas, max_local, per_node)
            traces = {b: validation_rows(trace, init, b) for b in sorted({init, max_batch})}
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc
        folder = out / name
        folder.mkdir(exist_ok=True)
        _write_csv(folder / f"placements-{dtype}.csv", PLACEMENT_COLUMNS, steps)
        # Every placement of the pool is in placements-<type>.csv: nothing to interpolate.
        _write_csv(folder / f"scalability-{dtype}.csv", SCALABILITY_COLUMNS, [])
        for batch, rows in traces.items():
            _write_csv(folder / f"validation-{batch}.csv", VALIDATION_COLUMNS, rows)
        spec = {k: job["spec"][k] for k in _SPEC_FIELDS if k in job["spec"]}
        specs.append(JobSpec(
            name=name, application=name, submit_time=float(job["submit_time"]) - t0,
            batch_size=init, target_epochs=len(trace), **spec,
        ))
        real[name] = float(job["jct"])
    simulated_cluster = ClusterSpec(
        name="measured",
        device_types=[DeviceType(name=dtype, memory_gb=1.0)],
        nodes=[NodeGroup(device_type=dtype, devices_per_node=per_node, count=1)],
    )
    run = MeasuredRun(
        profiles=out, jobs=specs, cluster=simulated_cluster, policy=str(cluster["policy"]),
        interval_s=float(cluster["interval_s"]),
        policy_restart_delay=cluster.get("restart_delay_s"),
        policy_knobs=dict(cluster.get("knobs") or {}),
        costs=restart_costs(finished), real_jct=real, notes=notes,
    )
    (out / "run.json").write_text(json.dumps(run.to_json(), indent=2))
    return run


def simulate_run(run: MeasuredRun) -> Any:
    """The run replayed by the simulator: same jobs, arrivals, policy, rounds, restart costs."""
    from shoal.backends.sim.profile import ProfileLibrary
    from shoal.backends.sim.run import simulate
    from shoal.policy.registry import tuned_policy

    policy = tuned_policy(run.policy, run.policy_knobs, run.policy_restart_delay)
    costs = run.costs
    return simulate(
        run.jobs, policy, run.cluster, ProfileLibrary(run.profiles),
        interval=run.interval_s, restart_delay=costs.restart_delay,
        start_delay=costs.start_delay, resize_overlap=costs.resize_overlap,
        finish_delay=costs.finish_delay, max_time=100 * max(run.real_jct.values()),
        time_resolution=0.0,  # real epochs can take milliseconds
    )


def compare(run: MeasuredRun, result: Any) -> dict[str, Any]:
    """Real and simulated JCT per job and on average; ``error`` is relative to the real one."""
    simulated = {
        r.name: (r.finish_time - r.spec.submit_time)
        if r.finish_time is not None and not r.failure else None
        for r in result.records
    }
    failures = {r.name: r.failure for r in result.records if r.failure}
    rows = [{"job": name, "real_jct_s": jct, "sim_jct_s": simulated.get(name)}
            for name, jct in run.real_jct.items()]
    real_avg = statistics.fmean(run.real_jct.values())
    done = [s for s in simulated.values() if s is not None]
    sim_avg = statistics.fmean(done) if len(done) == len(simulated) else None
    return {
        "jobs": rows,
        "real_avg_jct_s": real_avg,
        "sim_avg_jct_s": sim_avg,
        "error": None if sim_avg is None else (sim_avg - real_avg) / real_avg,
        "costs": asdict(run.costs),
        "sim_failures": failures,
    }
