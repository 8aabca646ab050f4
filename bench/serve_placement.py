"""Serving placement on the Azure `code` trace: shoal (AlpaServe-style model-parallel greedy)
against selective replication and periodic re-placement, swept over cluster size, SLO scale and
arrival burstiness. Prints tables, writes JSON and PNG plots.

    .venv/bin/python bench/serve_placement.py            # 5 minutes of trace (~3 min, 2 cores)
    .venv/bin/python bench/serve_placement.py --long     # 15 minutes of trace (~20 min)
    .venv/bin/python bench/serve_placement.py --quick    # smaller sweep
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shoal.serve.evaluate import ServeSimConfig, build_problem, run_policy
from shoal.serve.plots import plot_sweep

POLICIES = ("shoal", "selective-replication", "periodic")
BASE = ServeSimConfig(trace="code", models=8, devices="v100:32", slo_scale=5.0, rate_scale=2.0,
                      duration_s=900.0, mix=("opt-6.7b",), max_batch=4, seed=0,
                      period_s=60.0, screen_keep_every=4)


def run_point(config: ServeSimConfig) -> dict[str, dict]:
    out = {}
    for policy in POLICIES:
        res = run_policy(policy, build_problem(config), config)
        out[policy] = {"summary": res["summary"], "parallel": res.get("parallel"),
                       "search_seconds": res["search_seconds"]}
    return out


def sweep(name: str, values: list, make, console: Console) -> dict:
    table = Table(title=f"SLO attainment (%) vs {name}")
    table.add_column(name)
    for policy in POLICIES:
        table.add_column(policy)
    table.add_column("shoal split (size,pp,tp)")
    points = []
    for value in values:
        started = time.perf_counter()
        results = run_point(make(value))
        points.append({"value": value, "results": results})
        split = results["shoal"]["parallel"]
        table.add_row(str(value), *(f"{100 * results[p]['summary']['slo_attainment']:.2f}"
                                    for p in POLICIES),
                      f"{split['group_size']},{split['pp']},{split['tp']}")
        console.print(f"  {name}={value}: {time.perf_counter() - started:.0f} s")
    console.print(table)
    return {"name": name, "points": points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--long", action="store_true")
    parser.add_argument("--out", default="bench/results/serve_placement.json")
    parser.add_argument("--plots", default="docs/serving")
    args = parser.parse_args()
    console = Console()
    devices = [16, 32, 48] if args.quick else [16, 24, 32, 40, 48, 64]
    slo_scales = [2.5, 10.0] if args.quick else [2.5, 5.0, 10.0, 20.0]
    cvs = [1.0, 8.0] if args.quick else [1.0, 4.0, 8.0]
    base = BASE if args.long else replace(BASE, duration_s=300.0)
    report = {"base": {**base.__dict__, "mix": list(base.mix)}, "sweeps": []}
    report["sweeps"].append(sweep("devices", devices,
                                  lambda d: replace(base, devices=f"v100:{d}"), console))
    report["sweeps"].append(sweep("slo_scale", slo_scales,
                                  lambda s: replace(base, slo_scale=s), console))
    report["sweeps"].append(sweep("cv", cvs, lambda c: replace(base, cv=c), console))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    plots = Path(args.plots)
    plots.mkdir(parents=True, exist_ok=True)
    labels = {"devices": "devices (V100)", "slo_scale": "SLO scale", "cv": "CV of inter-arrivals"}
    for sw in report["sweeps"]:
        x = [p["value"] for p in sw["points"]]
        series = {pol: [p["results"][pol]["summary"]["slo_attainment"] for p in sw["points"]]
                  for pol in POLICIES}
        plot_sweep(x, series, labels[sw["name"]], plots / f"attainment_vs_{sw['name']}.png")
    console.print(f"wrote {args.out} and plots in {plots}/")


if __name__ == "__main__":
    main()
