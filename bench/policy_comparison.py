"""Compare every policy and shoal's ablations on Pollux workloads and heterogeneous clusters.

    .venv/bin/python bench/policy_comparison.py [--workloads 1-8]
        [--clusters pollux-t4-64,hetero-64,hetero-256]
        [--policies fifo,tiresias,optimus,gavel,pollux,sia,shoal,shoal-no-...] [--jobs 2]
        [--profiles DIR] [--json out/policy_comparison.json] [--cache out/policy_runs]

Prints, per cluster and policy, the mean over workloads of average and p99 JCT, makespan,
device-hours per job and restarts per job, and the worst finish-time fairness; then the
acceptance ratios: shoal's average JCT, p99 JCT and makespan over pollux's and sia's, and sia's
average JCT over pollux's, each the mean of per-workload ratios. Each cluster reads the
profiles of its preset (the Pollux traces for ``pollux-t4-64``, ``data/profiles-hetero`` for
the heterogeneous presets) unless ``--profiles`` names one directory for all. Each
simulation's report is kept in ``--cache`` and reused by later invocations with the same
settings and sources, so a long comparison can be run piecewise. Run it from the repository
root: the default paths are relative to it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from environment import describe
from rich.console import Console
from rich.table import Table

from shoal.cli.sim import SUMMARY_COLUMNS, _by_policy, _fmt, run_one
from shoal.policy import POLICIES

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "pollux"
# Per-type profiles of the heterogeneous presets (relative, as the cached reports' keys have it).
HETERO_PROFILES = "data/profiles-hetero"
PRESET_PROFILES = {"hetero-64": HETERO_PROFILES, "hetero-256": HETERO_PROFILES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="1-8")
    parser.add_argument("--clusters", default="pollux-t4-64")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--profiles", default=None,
                        help="one profile directory for every cluster (default: per preset)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", default="out/policy_comparison.json")
    parser.add_argument("--cache", default="out/policy_runs")
    args = parser.parse_args()
    workloads = workload_numbers(args.workloads)
    tasks = [
        {"workload": str(DATA / "workloads" / f"workload-{w}.csv"), "policy": p,
         "cluster": c, "profiles": args.profiles or profiles_for(c), "interval": 60.0,
         "restart_delay": 30.0, "seed": 0}
        for c in args.clusters.split(",") for p in args.policies.split(",") for w in workloads
    ]
    cache = Path(args.cache) / source_version()
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
    ratios: dict[str, dict[str, float]] = {}
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
        ratios[cluster] = acceptance_ratios([r["summary"] for r in rows])
        for name, value in ratios[cluster].items():
            console.print(f"  {name}: {value:.3f}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": environment, "by_cluster": out,
                                "ratios": ratios, "runs": [r["summary"] for r in reports]},
                               indent=2))
    console.print(f"wrote {path}")


def workload_numbers(spec: str) -> list[int]:
    """``"1-8"`` or ``"3"``: the Pollux workloads to run."""
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def profiles_for(cluster: str) -> str:
    """The profile directory a cluster preset's comparison reads."""
    return PRESET_PROFILES.get(cluster, str(DATA / "traces"))


RATIOS = (("shoal", "pollux", "avg_jct_s"), ("shoal", "pollux", "p99_jct_s"),
          ("shoal", "pollux", "makespan_s"), ("shoal", "sia", "avg_jct_s"),
          ("shoal", "sia", "p99_jct_s"), ("shoal", "sia", "makespan_s"),
          ("sia", "pollux", "avg_jct_s"))


def acceptance_ratios(summaries: list[dict]) -> dict[str, float]:
    """Mean over workloads of each per-workload ratio in RATIOS, for the policy pairs that ran
    on the same workloads (the acceptance targets are stated this way)."""
    by_policy: dict[str, dict[str, dict]] = {}
    for summary in summaries:
        by_policy.setdefault(summary["policy"], {})[summary["workload"]] = summary
    out = {}
    for policy, base, key in RATIOS:
        ours, theirs = by_policy.get(policy, {}), by_policy.get(base, {})
        common = sorted(ours.keys() & theirs.keys())
        if common:
            out[f"{policy} / {base} {key}"] = statistics.fmean(
                ours[w][key] / theirs[w][key] for w in common)
    return out


def source_version() -> str:
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
