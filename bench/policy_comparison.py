"""Compare every policy and shoal's ablations on Pollux workloads and heterogeneous clusters.

    .venv/bin/python bench/policy_comparison.py [--workloads 1-8] [--clusters pollux-t4-64]
        [--policies fifo,tiresias,optimus,gavel,pollux,sia,shoal,shoal-no-...] [--jobs 2]
        [--profiles DIR] [--json out/policy_comparison.json] [--cache out/policy_runs]

Prints, per cluster and policy, the mean over workloads of average and p99 JCT, makespan,
device-hours per job and restarts per job, and the worst finish-time fairness; then shoal's
ratio to pollux and sia. The heterogeneous presets need per-type profiles (``--profiles
data/profiles-hetero``). Each simulation's report is kept in ``--cache`` and reused by later
invocations with the same settings and sources, so a long comparison can be run piecewise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from environment import describe
from rich.console import Console
from rich.table import Table

from shoal.cli.sim import SUMMARY_COLUMNS, _by_policy, _fmt, run_one
from shoal.policy import POLICIES

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "pollux"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="1-8")
    parser.add_argument("--clusters", default="pollux-t4-64")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--profiles", default=str(DATA / "traces"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", default="out/policy_comparison.json")
    parser.add_argument("--cache", default="out/policy_runs")
    args = parser.parse_args()
    lo, _, hi = args.workloads.partition("-")
    workloads = range(int(lo), int(hi or lo) + 1)
    tasks = [
        {"workload": str(DATA / "workloads" / f"workload-{w}.csv"), "policy": p,
         "cluster": c, "profiles": args.profiles, "interval": 60.0, "restart_delay": 30.0,
         "seed": 0}
        for c in args.clusters.split(",") for p in args.policies.split(",") for w in workloads
    ]
    cache = Path(args.cache) / _source_version()
    cache.mkdir(parents=True, exist_ok=True)
    environment = describe()
    (cache / f"environment-{_environment_key(environment)}.json").write_text(
        json.dumps(environment, indent=1))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        reports = list(pool.map(_cached_run, tasks, [cache] * len(tasks)))
    for task, report in zip(tasks, reports, strict=True):
        report["summary"]["cluster"] = task["cluster"]
    console = Console(width=170)
    out = {}
    for cluster in args.clusters.split(","):
        rows = [r for r in reports if r["summary"]["cluster"] == cluster]
        agg = _by_policy(rows)
        out[cluster] = agg
        table = Table(title=f"{cluster}: mean over workloads {args.workloads}")
        table.add_column("policy")
        for title, _, _ in SUMMARY_COLUMNS:
            table.add_column(title, justify="right")
        for name, values in agg.items():
            table.add_row(name, *(_fmt(values.get(k), f) for _, k, f in SUMMARY_COLUMNS))
        console.print(table)
        if "shoal" in agg:
            for base in ("pollux", "sia"):
                if base in agg:
                    ratio = agg["shoal"]["avg_jct_s"] / agg[base]["avg_jct_s"]
                    console.print(f"  shoal / {base} avg JCT: {ratio:.3f}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": environment, "by_cluster": out,
                                "runs": [r["summary"] for r in reports]}, indent=2))
    console.print(f"wrote {path}")


def _source_version() -> str:
    """A digest of shoal's sources: cached reports are reused only for the same code."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "shoal").rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _environment_key(environment: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(environment, sort_keys=True).encode()).hexdigest()[:8]


def _cached_run(task: dict, cache: Path) -> dict:
    key = hashlib.sha256(json.dumps(task, sort_keys=True).encode()).hexdigest()[:16]
    path = cache / f"{task['cluster']}-{task['policy']}-{Path(task['workload']).stem}-{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    report = run_one(task)
    path.write_text(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
