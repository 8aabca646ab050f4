"""Per-job and summary metrics of a run, as JSON, and the comparison plot.

Finish-time fairness (Themis): a job's JCT on the shared cluster over its JCT alone on 1/n of
the cluster, where n is the average number of jobs active while it was in the system.

A job's queued time is the part of its JCT in which it held no devices (before its first start
and while preempted); the rest it held devices, restarting or training.

Serve and stream jobs are not jobs that complete: the end of a service is the end of its
``duration_s``, not a completion time. They are left out of every JCT statistic and reported
under ``services``: SLO attainment, requests and p99 latency (serve), lag (stream), and the
devices they held (peak, mean, device-hours).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shoal.core.types import JobState


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(result, fairness: bool = True) -> dict[str, Any]:
    """JSON-ready metrics of a :class:`~shoal.backends.sim.run.SimResult`-like run."""
    capacity = result.cluster.total_devices
    jobs = []
    service_rows = []
    for rec in result.records:
        if rec.spec.kind != "train":
            service_rows.append(_service_row(rec, getattr(result, "services", {})))
            continue
        jct = None
        if rec.state == JobState.FINISHED and rec.finish_time is not None:
            jct = rec.finish_time - rec.spec.submit_time
        jobs.append({
            "name": rec.name,
            "tenant": rec.spec.tenant,
            "application": rec.spec.application,
            "state": str(rec.state),
            "submit_s": rec.spec.submit_time,
            "start_s": rec.start_time,
            "finish_s": rec.finish_time,
            "jct_s": jct,
            "restarts": rec.num_restarts,
            "device_seconds": rec.device_seconds,
            "profiling_device_seconds": rec.profiling_seconds,
            "queued_s": rec.queued_seconds(),
            "failure": rec.failure,
        })
        plans = getattr(result, "plans", {}).get(rec.name)
        if plans:  # a job that declares its model: the plan of each allocation, in order
            jobs[-1]["plans"] = plans
    if fairness and hasattr(result, "isolated_jct"):
        for row in jobs:
            iso = result.isolated_jct.get(row["name"])
            row["isolated_jct_s"] = iso
            row["ftf"] = row["jct_s"] / iso if iso and row["jct_s"] is not None else None
    jcts = [j["jct_s"] for j in jobs if j["jct_s"] is not None]
    queued = [j["queued_s"] for j in jobs if j["queued_s"] is not None]
    submits = [j["submit_s"] for j in jobs]
    finishes = [j["finish_s"] for j in jobs if j["jct_s"] is not None]
    makespan = (max(finishes) - min(submits)) if finishes else 0.0
    used = sum(j["device_seconds"] for j in jobs)
    # Utilization counts the services' devices too, over the span of the whole run.
    ends = finishes + [s["finish_s"] for s in service_rows if s["finish_s"] is not None]
    starts = submits + [s["submit_s"] for s in service_rows]
    span = (max(ends) - min(starts)) if ends else 0.0
    busy = used + sum(s["device_seconds"] for s in service_rows)
    ftfs = [j["ftf"] for j in jobs if j.get("ftf") is not None]
    decision = [r.decision_seconds for r in result.rounds if r.active_jobs]
    summary = {
        "policy": result.policy,
        "cluster": result.cluster.name,
        "devices": capacity,
        "jobs": len(jobs),
        "finished": len(jcts),
        "failed": sum(1 for j in jobs if j["state"] == str(JobState.FAILED)),
        "avg_jct_s": statistics.fmean(jcts) if jcts else float("nan"),
        "median_jct_s": statistics.median(jcts) if jcts else float("nan"),
        "p99_jct_s": _percentile(jcts, 99),
        "avg_queued_s": statistics.fmean(queued) if queued else float("nan"),
        "makespan_s": makespan,
        "utilization": busy / (capacity * span) if span > 0 else 0.0,
        "device_hours_per_job": used / 3600 / max(len(jobs), 1),
        "profiling_device_hours": sum(j["profiling_device_seconds"] for j in jobs) / 3600,
        "restarts_per_job": statistics.fmean([j["restarts"] for j in jobs]) if jobs else 0.0,
        "worst_ftf": max(ftfs) if ftfs else None,
        "median_decision_ms": 1e3 * statistics.median(decision) if decision else 0.0,
        "p95_decision_ms": 1e3 * _percentile(decision, 95) if decision else 0.0,
        "timed_out": getattr(result, "timed_out", False),
        "services": len(service_rows),
        **_service_totals(service_rows),
    }
    timeline = [[r.time, r.allocated_devices, r.active_jobs] for r in result.rounds]
    return {"summary": summary, "jobs": jobs, "services": service_rows, "timeline": timeline}


def _service_row(rec, measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One serve / stream job: what it promised, what it measured, the devices it held."""
    got = measured.get(rec.name, {})
    lived = ((rec.finish_time if rec.finish_time is not None else float("nan"))
             - (rec.start_time if rec.start_time is not None else rec.spec.submit_time))
    row: dict[str, Any] = {
        "name": rec.name,
        "kind": rec.spec.kind,
        "tenant": rec.spec.tenant,
        "state": str(rec.state),
        "submit_s": rec.spec.submit_time,
        "start_s": rec.start_time,
        "finish_s": rec.finish_time,
        "device_seconds": rec.device_seconds,
        "peak_devices": got.get("peak_devices"),
        "mean_devices": rec.device_seconds / lived if lived > 0 else None,
        "failure": rec.failure,
    }
    if rec.spec.kind == "serve":
        row.update(slo_s=rec.spec.serve.slo_s if rec.spec.serve is not None else None,
                   requests=got.get("requests"), slo_attainment=got.get("slo_attainment"),
                   p99_latency_s=got.get("p99_latency_s"))
    else:
        row.update(max_lag_s=got.get("max_lag_s"), final_lag_s=got.get("final_lag_s"),
                   max_lag_bound_s=rec.spec.stream.max_lag_s if rec.spec.stream else None)
    return row


def _service_totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Run-level service figures: request-weighted SLO attainment, worst stream lag."""
    serve = [r for r in rows if r["kind"] == "serve" and r.get("requests")]
    streams = [r for r in rows if r["kind"] == "stream" and r.get("max_lag_s") is not None]
    requests = sum(r["requests"] for r in serve)
    return {
        "service_slo_attainment": (sum(r["slo_attainment"] * r["requests"] for r in serve)
                                   / requests if requests else None),
        "service_requests": requests,
        "worst_stream_lag_s": max((r["max_lag_s"] for r in streams), default=None),
        "service_device_hours": sum(r["device_seconds"] for r in rows) / 3600,
    }


def plot_comparison(reports: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """JCT CDF per policy and allocated devices over time, in one PNG (or any matplotlib format)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_cdf, ax_alloc) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, report in reports.items():
        jcts = sorted(j["jct_s"] / 3600 for j in report["jobs"] if j["jct_s"] is not None)
        if jcts:
            ax_cdf.step(jcts, np.arange(1, len(jcts) + 1) / len(jcts), where="post", label=name)
        times = [t / 3600 for t, _, _ in report["timeline"]]
        alloc = [a for _, a, _ in report["timeline"]]
        ax_alloc.plot(times, alloc, label=name, linewidth=1)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("job completion time (hours)")
    ax_cdf.set_ylabel("fraction of jobs")
    ax_cdf.set_title("JCT CDF")
    ax_alloc.set_xlabel("time (hours)")
    ax_alloc.set_ylabel("allocated devices")
    ax_alloc.set_title("Allocated devices over time")
    for ax in (ax_cdf, ax_alloc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
