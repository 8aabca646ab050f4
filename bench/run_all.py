"""Run shoal's benchmarks one after another and summarize them (``make bench``).

    .venv/bin/python bench/run_all.py [--suite quick|full] [--only NAME,...] [--out out/bench]

``quick`` (about 3 minutes on 2 cores) runs the benchmarks that finish in minutes, at
settings small enough for a laptop; ``full`` adds the long ones at the settings the figures in
``docs/`` were measured with (several hours on 2 cores). Each benchmark prints its own table
and writes its JSON under ``--out``; at the end one table lists each benchmark's status, wall
time and JSON file, also written to ``<out>/run_all.json``. The published results in
``bench/results/`` are not overwritten.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str
    args: tuple[str, ...]
    json_flag: str  # the script's option naming its JSON output
    suite: str  # "quick" or "full"


BENCHMARKS = (
    Benchmark("plan_search", "plan_search.py", (), "--out", "quick"),
    Benchmark("decision_time", "decision_time.py",
              ("--policies", "pollux,sia,shoal", "--scales", "64x160,2048x1000",
               "--repeats", "3"), "--json", "quick"),
    Benchmark("train_overhead", "train_overhead.py", ("--rounds", "4"), "--out", "quick"),
    Benchmark("resize_time", "resize_time.py", (), "--out", "quick"),
    Benchmark("sim_fidelity", "sim_fidelity.py", ("--workloads", "1"), "--json", "quick"),
    Benchmark("model_error", "model_error.py", (), "--json", "quick"),
    Benchmark("decision_time_full", "decision_time.py",
              ("--policies", "shoal,sia", "--repeats", "11"), "--json", "full"),
    Benchmark("sim_fidelity_full", "sim_fidelity.py", (), "--json", "full"),
    Benchmark("policy_comparison", "policy_comparison.py",
              ("--workloads", "1-8", "--clusters", "pollux-t4-64"), "--json", "full"),
    Benchmark("by_application", "by_application.py", ("--cluster", "pollux-t4-64"), "--json",
              "full"),
    Benchmark("alone_bound", "alone_bound.py",
              ("--workloads", "1-8", "--jobs", "2", "--table",
               "bench/results/policy_comparison_1-8.json"), "--json", "full"),
    Benchmark("serve_fidelity", "serve_fidelity.py", (), "--json", "full"),
    Benchmark("serve_placement", "serve_placement.py", ("--plots", "out/bench/serving"),
              "--out", "full"),
    Benchmark("llm_mix", "llm_mix.py", (), "--json", "full"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("quick", "full"), default="quick")
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    args = parser.parse_args()
    names = {b.name for b in BENCHMARKS}
    only = [n for n in args.only.split(",") if n]
    unknown = sorted(set(only) - names)
    if unknown:
        parser.error(f"--only: unknown benchmark(s) {', '.join(unknown)}; "
                     f"choose from {', '.join(sorted(names))}")
    if only:
        chosen = [b for b in BENCHMARKS if b.name in only]
    else:
        chosen = [b for b in BENCHMARKS if args.suite == "full" or b.suite == "quick"]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for bench in chosen:
        out = args.out / f"{bench.name}.json"
        command = [sys.executable, str(ROOT / "bench" / bench.script), *bench.args,
                   bench.json_flag, str(out)]
        print(f"\n== {bench.name}: {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        code = subprocess.call(command, cwd=ROOT)
        rows.append({"name": bench.name, "status": "ok" if code == 0 else f"exit {code}",
                     "seconds": round(time.perf_counter() - start, 1),
                     "json": str(out) if out.exists() else None})
    table = Table(title=f"benchmarks ({args.suite if not only else 'selected'})")
    for column in ("benchmark", "status", "wall (s)", "JSON"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row["status"], f"{row['seconds']:.0f}", row["json"] or "-")
    Console(width=150).print(table)
    (args.out / "run_all.json").write_text(json.dumps(rows, indent=2))
    if any(row["status"] != "ok" for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
