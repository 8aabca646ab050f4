"""Rich renderings of the service's answers, shared by ls, show, top and the demo."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table
from rich.text import Text

_STATE_STYLE = {
    "pending": "yellow",
    "restarting": "cyan",
    "running": "green",
    "finished": "bold green",
    "failed": "red",
}


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    value = max(0.0, float(value))
    if value < 120:
        return f"{value:.0f}s"
    return f"{value / 60:.1f}m"


def _number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def service_line(job: dict[str, Any]) -> str:
    """A serve job's measurements in one line: requests/s, SLO attainment, p99 latency; a
    stream job's: input samples/s and lag."""
    service = job.get("service") or {}
    if service.get("kind") == "stream":
        rate, lag = service.get("input_rate"), service.get("lag_s")
        return (f"{rate:.1f} samples/s" if rate is not None else "- samples/s") + (
            f" lag {lag:.1f}s" if lag is not None else " lag -")
    rate = service.get("arrival_rate")
    attainment = service.get("slo_attainment")
    p99 = service.get("p99_latency_s")
    parts = [f"{rate:.1f} req/s" if rate is not None else "- req/s",
             f"SLO {attainment:.1%}" if attainment is not None else "SLO -"]
    if p99 is not None:
        parts.append(f"p99 {1000 * p99:.0f}ms")
    return " ".join(parts)


def jobs_table(jobs: list[dict[str, Any]], title: str | None = None) -> Table:
    table = Table(title=title, expand=False, header_style="bold")
    table.add_column("job", overflow="fold", min_width=12)
    table.add_column("state", no_wrap=True)
    for column in ("dev", "batch", "progress", "ep", "goodput", "rst", "time", "eta"):
        table.add_column(column, justify="right", no_wrap=True)
    now = time.time()
    for job in jobs:
        alloc = job.get("allocation") or {}
        progress = float(job.get("progress") or 0.0)
        filled = round(progress * 8)
        bar = "█" * filled + "░" * (8 - filled)
        end = job["finish_time"] if job.get("finish_time") is not None else now
        elapsed = job["jct"] if job.get("jct") is not None else end - job["submit_time"]
        if job.get("kind", "train") != "train":  # a service: its measurements, no progress
            table.add_row(
                job["name"],
                Text(job["state"], style=_STATE_STYLE.get(job["state"], "")),
                str(alloc.get("replicas", 0)), "-", service_line(job), job["kind"], "-",
                str(job.get("num_restarts", 0)), _seconds(elapsed), "-",
            )
            continue
        table.add_row(
            job["name"],
            Text(job["state"], style=_STATE_STYLE.get(job["state"], "")),
            str(alloc.get("replicas", 0)),
            str(job.get("batch_size") or "-"),
            f"{bar} {progress:4.0%}",
            str(job.get("epoch", "-")),
            _number(job.get("goodput"), 0),
            str(job.get("num_restarts", 0)),
            _seconds(elapsed),
            _seconds(job.get("eta_seconds")) if job["state"] not in ("finished", "failed")
            else "-",
        )
    return table


def cluster_line(cluster: dict[str, Any]) -> Text:
    parts = []
    for node in cluster["nodes"]:
        used, cap = node["used"], node["capacity"]
        cells = "█" * used + "·" * max(cap - used, 0)
        parts.append(f"node {node['node_id']} [{node['device_type']}] {cells} {used}/{cap}")
    return Text(
        f"{cluster['pool']} · policy {cluster['policy']} · round every "
        f"{cluster['interval_s']:g}s · " + "  ".join(parts)
    )
