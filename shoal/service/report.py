"""Summary of a real run from the service's job list: JCT, resizes, goodput; JSON, PNG, HTML."""

from __future__ import annotations

import html
import json
import statistics
from pathlib import Path
from typing import Any


def summarize(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for job in jobs:
        runs = job.get("runs") or []
        rows.append({
            "name": job["name"],
            "state": job["state"],
            "jct_s": job.get("jct"),
            "queued_s": job.get("queued_seconds"),
            "submit_time": job["submit_time"],
            "finish_time": job.get("finish_time"),
            "resizes": job.get("resizes", 0),
            "attempts": job.get("attempt", len(runs)),
            "device_seconds": job.get("device_seconds", 0.0),
            "max_replicas_used": max((r["replicas"] for r in runs), default=0),
            "final_batch_size": job.get("batch_size"),
            "goodput": job.get("goodput"),
            "runs": runs,
        })
    done = [r["jct_s"] for r in rows if r["state"] == "finished" and r["jct_s"] is not None]
    queued = [r["queued_s"] for r in rows
              if r["state"] == "finished" and r["queued_s"] is not None]
    starts = [r["submit_time"] for r in rows]
    ends = [r["finish_time"] for r in rows if r["finish_time"] is not None]
    return {
        "jobs": rows,
        "finished": len(done),
        "failed": sum(1 for r in rows if r["state"] == "failed"),
        "avg_jct_s": statistics.fmean(done) if done else None,
        "median_jct_s": statistics.median(done) if done else None,
        "avg_queued_s": statistics.fmean(queued) if queued else None,
        "makespan_s": (max(ends) - min(starts)) if ends and starts else None,
        "total_resizes": sum(r["resizes"] for r in rows),
        "device_seconds": sum(r["device_seconds"] for r in rows),
    }


def plot(summary: dict[str, Any], path: Path) -> Path:
    """Replicas of each job over time (one lane per job)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = summary["jobs"]
    t0 = min((j["submit_time"] for j in jobs), default=0.0)
    fig, ax = plt.subplots(figsize=(9, 1 + 0.8 * max(len(jobs), 1)))
    for lane, job in enumerate(jobs):
        runs = job["runs"]
        end = job["finish_time"] or (runs[-1]["time"] if runs else job["submit_time"])
        ax.plot([job["submit_time"] - t0, end - t0], [lane, lane], color="lightgray", lw=1)
        for k, run in enumerate(runs):
            stop = runs[k + 1]["time"] if k + 1 < len(runs) else end
            ax.barh(lane, stop - run["time"], left=run["time"] - t0, height=0.2 * run["replicas"],
                    color=f"C{lane}", alpha=0.8)
            ax.text(run["time"] - t0, lane + 0.12 * run["replicas"] + 0.05, str(run["replicas"]),
                    fontsize=7)
    ax.set_yticks(range(len(jobs)), [j["name"] for j in jobs])
    ax.set_xlabel("seconds since the first submission (bar height = replicas)")
    ax.set_title("allocations over time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(summary: dict[str, Any], folder: Path, title: str) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / "summary.json"
    json_path.write_text(json.dumps(summary, indent=2))
    png = plot(summary, folder / "allocations.png")

    def cell(value: Any, digits: int = 1) -> str:
        if isinstance(value, float):
            return f"{value:.{digits}f}"
        return html.escape(str(value if value is not None else "-"))

    rows = "".join(
        f"<tr><td>{cell(j['name'])}</td><td>{cell(j['state'])}</td><td>{cell(j['jct_s'])}</td>"
        f"<td>{cell(j['queued_s'])}</td><td>{cell(j['resizes'])}</td>"
        f"<td>{cell(j['max_replicas_used'])}</td>"
        f"<td>{cell(j['final_batch_size'])}</td><td>{cell(j['goodput'])}</td></tr>"
        for j in summary["jobs"]
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 10px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>average JCT {cell(summary['avg_jct_s'])} s · queued {cell(summary['avg_queued_s'])} s ·
makespan {cell(summary['makespan_s'])} s ·
resizes {summary['total_resizes']} · finished {summary['finished']} · failed {summary['failed']}
</p>
<table><tr><th>job</th><th>state</th><th>JCT s</th><th>queued s</th><th>resizes</th>
<th>max replicas</th><th>last batch</th><th>goodput (samples/s)</th></tr>{rows}</table>
<p><img src="{png.name}" alt="allocations over time"></p></body></html>"""
    html_path = folder / "report.html"
    html_path.write_text(page)
    return {"json": json_path, "png": png, "html": html_path}
