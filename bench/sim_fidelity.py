"""Fidelity of shoal's simulator against the Pollux artifact's published results.

Runs tiresias, optimus and pollux on Pollux workloads 1-8 (cluster pollux-t4-64, 60 s rounds,
30 s restart delay) and prints, per workload, our average JCT, the artifact's, and their ratio,
plus each run's wall time. Writes everything to JSON.

    .venv/bin/python bench/sim_fidelity.py [--policies tiresias,optimus,pollux] \
        [--workloads 1-8] [--jobs 2] [--json out/sim_fidelity.json]
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "pollux"


def _run(args: tuple[str, int]) -> dict:
    from shoal.backends.sim.profile import ProfileLibrary
    from shoal.backends.sim.run import simulate
    from shoal.metrics.report import summarize
    from shoal.policy import make_policy
    from shoal.spec import load_cluster, load_workload_csv

    policy, workload = args
    jobs = load_workload_csv(DATA / "workloads" / f"workload-{workload}.csv")
    started = time.perf_counter()
    cpu_started = time.process_time()
    result = simulate(jobs, make_policy(policy), load_cluster("pollux-t4-64"),
                      ProfileLibrary(DATA / "traces"))
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    summary = summarize(result)["summary"]
    ref = json.loads((DATA / "results-jobload" / f"{policy}-1.0" / "summary.json").read_text())
    reference = ref["avgs"][f"workload-{workload}"]
    return {
        "policy": policy,
        "workload": workload,
        "avg_jct_s": summary["avg_jct_s"],
        "reference_avg_jct_s": reference,
        "ratio": summary["avg_jct_s"] / reference,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def _parse_range(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="tiresias,optimus,pollux")
    parser.add_argument("--workloads", default="1-8")
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes")
    parser.add_argument("--json", default="out/sim_fidelity.json")
    args = parser.parse_args()
    tasks = [(p, w) for p in args.policies.split(",") for w in _parse_range(args.workloads)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_run, tasks))
    table = Table(title="Average JCT: shoal simulator vs Pollux artifact (pollux-t4-64)")
    for col in ("policy", "workload", "ours (s)", "artifact (s)", "ratio", "wall (s)", "cpu (s)"):
        table.add_column(col, justify="right")
    means: dict[str, dict[str, float]] = {}
    for row in rows:
        table.add_row(row["policy"], str(row["workload"]), f"{row['avg_jct_s']:.0f}",
                      f"{row['reference_avg_jct_s']:.0f}", f"{row['ratio']:.3f}",
                      f"{row['wall_s']:.1f}", f"{row['cpu_s']:.1f}")
        agg = means.setdefault(row["policy"], {"ours": 0.0, "ref": 0.0, "n": 0})
        agg["ours"] += row["avg_jct_s"]
        agg["ref"] += row["reference_avg_jct_s"]
        agg["n"] += 1
    for policy, agg in means.items():
        table.add_row(policy, "mean", f"{agg['ours'] / agg['n']:.0f}",
                      f"{agg['ref'] / agg['n']:.0f}", f"{agg['ours'] / agg['ref']:.3f}", "", "")
    Console().print(table)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
