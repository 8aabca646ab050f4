"""Where one policy gains or loses against another: JCT and device-hours per application.

    .venv/bin/python bench/by_application.py --cache out/policy_runs [--version V]
        [--cluster pollux-t4-64] [--policy shoal] [--reference pollux]
        [--json out/by_application.json]

Reads the per-job records of the reports ``bench/policy_comparison.py`` cached (run it first
for both policies; ``--version`` picks a source digest, default the current sources'). For
every application, summed over the workloads both policies ran: the jobs, the summed JCT
under each policy and its ratio, that application's share of the policy's summed JCT, the
device-hours and their ratio, and, where the reports record it, the hours its jobs spent queued
(submitted and holding no devices) under each policy. The summed-JCT ratio over all
applications is the ratio of the mean JCTs, so the shares say which applications a change of
the mean comes from.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from comparison_table import cached_reports
from policy_comparison import source_version
from rich.console import Console
from rich.table import Table


def load(cache: Path, version: str, cluster: str, policies: tuple[str, str]
           ) -> dict[str, dict[str, list[dict]]]:
    """Per policy and workload, the job records of the reports cached for ``version``."""
    found: dict[str, dict[str, list[dict]]] = defaultdict(dict)
    for (on, policy, workload), path in cached_reports(cache, version):
        if on == cluster and policy in policies:
            found[policy][workload] = json.loads(path.read_text())["jobs"]
    if not all(found.get(p) for p in policies):
        raise SystemExit(f"no cached reports of both {' and '.join(policies)} on {cluster} "
                         f"under {cache / version}: run bench/policy_comparison.py --policies "
                         f"{','.join(policies)} --clusters {cluster} --cache {cache} first")
    return found


def by_application(policy_jobs: dict[str, list[dict]], reference_jobs: dict[str, list[dict]]
                   ) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Per application, over the shared workloads: its jobs that finished under both policies,
    both policies' summed JCT (s) and device-hours, and their queued hours when every record
    has one (reports from before the per-job queued time have none)."""
    workloads = sorted(set(policy_jobs) & set(reference_jobs))
    pairs = []
    for workload in workloads:
        reference = {job["name"]: job for job in reference_jobs[workload]}
        pairs += [(job, reference[job["name"]]) for job in policy_jobs[workload]
                  if job["jct_s"] is not None and job["name"] in reference
                  and reference[job["name"]]["jct_s"] is not None]
    fields = [("jct", "jct_s", 1.0), ("device_hours", "device_seconds", 3600.0)]
    if all(record.get("queued_s") is not None for pair in pairs for record in pair):
        fields.append(("queued_hours", "queued_s", 3600.0))
    rows: dict[str, dict[str, float]] = {}
    for job, other in pairs:
        row = rows.setdefault(job["application"], {"jobs": 0})
        row["jobs"] += 1
        for name, key, unit in fields:
            row[name] = row.get(name, 0.0) + job[key] / unit
            row[f"reference_{name}"] = row.get(f"reference_{name}", 0.0) + other[key] / unit
    return workloads, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default="out/policy_runs")
    parser.add_argument("--version", default=None)
    parser.add_argument("--cluster", default="pollux-t4-64")
    parser.add_argument("--policy", default="shoal")
    parser.add_argument("--reference", default="pollux")
    parser.add_argument("--json", default="out/by_application.json")
    args = parser.parse_args()
    version = args.version or source_version()
    found = load(Path(args.cache), version, args.cluster, (args.policy, args.reference))
    workloads, rows = by_application(found[args.policy], found[args.reference])
    total = sum(row["jct"] for row in rows.values())
    reference_total = sum(row["reference_jct"] for row in rows.values())
    a, b = args.policy, args.reference
    table = Table(title=f"{args.cluster}, {a} against {b}, summed over {len(workloads)} "
                        f"workloads (source {version})")
    queued = all("queued_hours" in row for row in rows.values())
    titles = ["application", "jobs", f"{a} JCT (h)", f"{b} JCT (h)", "ratio", f"share of {a}",
              f"{a} device-h", f"{b} device-h", "ratio"]
    for title in titles + ([f"{a} queued (h)", f"{b} queued (h)"] if queued else []):
        table.add_column(title, justify="left" if title == "application" else "right")
    for app, row in sorted(rows.items(), key=lambda item: -item[1]["jct"]):
        cells = [app, str(row["jobs"]), f"{row['jct'] / 3600:.1f}",
                 f"{row['reference_jct'] / 3600:.1f}", f"{row['jct'] / row['reference_jct']:.3f}",
                 f"{row['jct'] / total:.3f}", f"{row['device_hours']:.0f}",
                 f"{row['reference_device_hours']:.0f}",
                 f"{row['device_hours'] / row['reference_device_hours']:.3f}"]
        if queued:
            cells += [f"{row['queued_hours']:.1f}", f"{row['reference_queued_hours']:.1f}"]
        table.add_row(*cells)
    console = Console(width=150)
    console.print(table)
    console.print(f"summed JCT {a} / {b}: {total / reference_total:.3f}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cluster": args.cluster, "policy": a, "reference": b,
                                "source_version": version, "workloads": workloads,
                                "applications": rows}, indent=2))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
