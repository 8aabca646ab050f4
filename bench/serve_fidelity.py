"""Simulator fidelity against the real serving path (FastAPI replicas + router on loopback).

Starts the replicas and the router, then for each SLO: profiles the real path on a window of
the trace, replays the next window open-loop through the router, and simulates the same
arrivals twice: with the profile measured before the replay ("before") and with the one the
replay's own requests measured ("same run"). Prints real vs simulated SLO attainment and p50/p99
latency and writes everything to JSON. Acceptance: attainment within 5 points, p99 within 20%.

    .venv/bin/python bench/serve_fidelity.py [--replicas 2] [--slo 0.1,0.2] [--rate-scale 4] \
        [--trace conv] [--start 10] [--profile 8] [--duration 20] \
        [--json bench/results/serve_fidelity.json]

About 15-40 s to start (two torch imports) plus ~35 s per SLO on the shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shoal.serve.fidelity import FidelityConfig, run_fidelity_on
from shoal.serve.launch import run_fast, start_serving

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--slo", default="0.1,0.2", help="comma-separated SLOs in seconds")
    parser.add_argument("--trace", default="conv")
    parser.add_argument("--rate-scale", type=float, default=4.0)
    parser.add_argument("--start", type=float, default=10.0,
                        help="seconds into the rate-scaled trace where profiling starts")
    parser.add_argument("--profile", type=float, default=8.0, help="profiling window, seconds")
    parser.add_argument("--duration", type=float, default=20.0, help="replay window, seconds")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "serve_fidelity.json"))
    args = parser.parse_args()

    configs = [FidelityConfig(replicas=args.replicas, max_batch=args.max_batch,
                              max_wait_s=args.max_wait_ms / 1000.0, trace=args.trace,
                              start_s=args.start, profile_s=args.profile,
                              duration_s=args.duration, rate_scale=args.rate_scale,
                              slo_s=float(slo)) for slo in args.slo.split(",")]
    started = time.perf_counter()
    runs = []
    with start_serving(replicas=args.replicas, max_batch=args.max_batch,
                       max_wait_s=args.max_wait_ms / 1000.0) as cluster:
        start_s = time.perf_counter() - started
        for config in configs:
            load_before = os.getloadavg()[0]
            report = run_fast(run_fidelity_on(cluster, config))
            report["load_average_1min"] = [load_before, os.getloadavg()[0]]
            runs.append(report)

    table = Table(title=f"serve fidelity: {args.trace} x{args.rate_scale}, {args.replicas} "
                        f"replicas, max batch {args.max_batch}, {args.duration:g} s replay")
    for column in ("SLO (ms)", "profile", "requests", "attainment real / sim", "gap (pts)",
                   "p50 real / sim (ms)", "p99 real / sim (ms)", "p99 err", "send lag p99",
                   "load avg", "pass"):
        table.add_column(column)
    for run in runs:
        real = run["real"]
        for label, sim, gap in (("before", run["sim"], run["gap"]),
                                ("same run", run["sim_same_run"], run["gap_same_run"])):
            ok = gap["attainment_gap_points"] <= 5.0 and gap["p99_relative_error"] <= 0.20
            table.add_row(
                f"{1000 * run['config']['slo_s']:g}", label, str(real["requests"]),
                f"{100 * real['slo_attainment']:.1f}% / {100 * sim['slo_attainment']:.1f}%",
                f"{gap['attainment_gap_points']:.1f}",
                f"{1000 * real['p50_latency_s']:.1f} / {1000 * sim['p50_latency_s']:.1f}",
                f"{1000 * real['p99_latency_s']:.1f} / {1000 * sim['p99_latency_s']:.1f}",
                f"{100 * gap['p99_relative_error']:.1f}%",
                f"{1000 * real['p99_send_lag_s']:.0f} ms",
                f"{run['load_average_1min'][0]:.1f}", "yes" if ok else "NO")
    console = Console(width=180)
    console.print(table)
    console.print(f"cluster start {start_s:.1f} s, total {time.perf_counter() - started:.1f} s")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cluster_start_s": start_s, "runs": runs}, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
