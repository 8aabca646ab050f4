"""Scheduling with parallel plans: Pollux jobs plus LLM fine-tuning jobs of 1.3-70B parameters.

    .venv/bin/python bench/llm_mix.py [--workload 1] [--pollux-jobs 160] [--llm-jobs 18]
        [--policies shoal,pollux,sia] [--modes search,default] [--cluster a100-mix-64]
        [--profiles data/profiles-hetero] [--jobs 2] [--json bench/results/llm_mix.json]

The workload is a Pollux trace (``workloads/workload-N.csv``, measured profiles; the A100
profiles serve both memory sizes) plus LLM fine-tuning jobs that declare only their model
(``JobSpec.model``), arriving uniformly over the trace's span (seeded). Each runs under each
policy twice: with plans chosen by the planner per allocation (``search``) and with the fixed
default plan (``default``: pure data parallel where it fits, else ZeRO-3). Both modes treat
allocations under which their plan does not fit as infeasible. Prints average and p99 JCT,
makespan and the LLM jobs' average JCT per run, then per LLM job its JCT and the allocation and
plan it held longest in each mode, and writes everything (with the allocations and plans each
LLM job ran under) to the JSON file.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "pollux"
PROFILE_ALIASES = {"a100-80g": "a100", "a100-40g": "a100"}

# (model, tokens to fine-tune on, global batch in sequences)
LLM_KINDS: tuple[tuple[str, int, int], ...] = (
    ("gpt-1.3b", 200_000_000, 256),
    ("llama-7b", 200_000_000, 256),
    ("llama-13b", 100_000_000, 256),
    ("llama-33b", 50_000_000, 256),
    ("llama-65b", 50_000_000, 256),
    ("llama-2-70b", 25_000_000, 256),
)


def llm_jobs(count: int, span: float, seed: int) -> list[dict[str, Any]]:
    """``count`` LLM jobs cycling through LLM_KINDS, submitted uniformly over ``span`` s."""
    rng = random.Random(seed)
    times = sorted(rng.uniform(0, span) for _ in range(count))
    kinds = [LLM_KINDS[i % len(LLM_KINDS)] for i in range(count)]
    rng.shuffle(kinds)
    return [{"name": f"llm-{i}-{model}", "model": model, "target_tokens": tokens,
             "batch_size": batch, "submit_time": round(t)}
            for i, ((model, tokens, batch), t) in enumerate(zip(kinds, times, strict=True))]


def workload(args: dict[str, Any]):
    from shoal.spec import JobSpec, load_workload_csv

    pollux = load_workload_csv(args["workload"])[: args["pollux_jobs"]]
    span = max((j.submit_time for j in pollux), default=8 * 3600.0)
    llm = [JobSpec(**row) for row in llm_jobs(args["llm_jobs"], span, args["seed"])]
    return pollux, llm


def run(task: dict[str, Any]) -> dict[str, Any]:
    from shoal.backends.sim.aliases import AliasedProfiles
    from shoal.backends.sim.profile import ProfileLibrary
    from shoal.backends.sim.run import simulate
    from shoal.metrics.report import summarize
    from shoal.policy import make_policy
    from shoal.spec import load_cluster

    pollux, llm = workload(task)
    profiles = AliasedProfiles(ProfileLibrary(task["profiles"]), PROFILE_ALIASES)
    started = time.perf_counter()
    result = simulate([*pollux, *llm], make_policy(task["policy"]), load_cluster(task["cluster"]),
                      profiles, plan_mode=task["mode"], seed=task["seed"])
    report = summarize(result)
    llm_names = {j.name for j in llm}
    # Each job row also carries its plan history; ``plans`` below keeps it once, summarized.
    llm_rows = [{k: v for k, v in j.items() if k != "plans"}
                for j in report["jobs"] if j["name"] in llm_names]
    llm_jcts = [j["jct_s"] for j in llm_rows if j["jct_s"] is not None]
    other = [j["jct_s"] for j in report["jobs"]
             if j["name"] not in llm_names and j["jct_s"] is not None]
    summary = report["summary"]
    summary.update(
        mode=task["mode"], seconds=time.perf_counter() - started,
        llm_jobs=len(llm_rows), llm_finished=len(llm_jcts),
        llm_avg_jct_s=statistics.fmean(llm_jcts) if llm_jcts else float("nan"),
        pollux_avg_jct_s=statistics.fmean(other) if other else float("nan"),
    )
    finish = {j["name"]: j["finish_s"] for j in llm_rows}
    plans = {name: plan_usage(history, finish.get(name))
             for name, history in result.plans.items()}
    return {"summary": summary, "llm_jobs": llm_rows, "plans": plans}


def _plan_text(entry: dict[str, Any]) -> str:
    p = entry["plan"]
    where = f"{entry['replicas']}x{entry['device_type']}"
    if p is None:
        return f"{where} no plan fits"
    recompute = p["recompute"] if p["recompute"] != "full" else (
        f"full({p['recompute_fraction']:g})")
    return (f"{where} dp{p['dp']} tp{p['tp']} pp{p['pp']} z{p['zero_stage']}"
            f"{' off' if p['offload'] else ''} {recompute}")


def plan_usage(history: list[dict[str, Any]], finish: float | None) -> list[dict[str, Any]]:
    """Each allocation-and-plan a job ran under: how often it was given and the seconds held
    (until the next allocation or the job's finish), most held first."""
    held: Counter[str] = Counter()
    times: Counter[str] = Counter()
    for i, entry in enumerate(history):
        end = history[i + 1]["time"] if i + 1 < len(history) else finish
        text = _plan_text(entry)
        times[text] += 1
        held[text] += (end - entry["time"]) if end is not None else 0.0
    return [{"allocation_and_plan": text, "times": times[text], "seconds": round(seconds, 1)}
            for text, seconds in held.most_common()]


def _usual_plan(usage: list[dict[str, Any]]) -> str:
    """The allocation and plan a job held longest."""
    return usage[0]["allocation_and_plan"] if usage else "-"


def _hours(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value / 3600:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="1", help="Pollux workload number or CSV path")
    parser.add_argument("--pollux-jobs", type=int, default=160)
    parser.add_argument("--llm-jobs", type=int, default=18)
    parser.add_argument("--policies", default="shoal,pollux,sia")
    parser.add_argument("--modes", default="search,default")
    parser.add_argument("--cluster", default="a100-mix-64")
    parser.add_argument("--profiles", default=str(ROOT / "data" / "profiles-hetero"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "llm_mix.json"))
    args = parser.parse_args()
    path = Path(args.workload)
    if not path.is_file():
        path = DATA / "workloads" / f"workload-{args.workload}.csv"
    base = {"workload": str(path), "pollux_jobs": args.pollux_jobs, "llm_jobs": args.llm_jobs,
            "cluster": args.cluster, "profiles": args.profiles, "seed": args.seed}
    tasks = [{**base, "policy": p, "mode": m}
             for p in args.policies.split(",") for m in args.modes.split(",")]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(run, tasks))

    console = Console(width=160)
    table = Table(title=f"{path.stem} ({args.pollux_jobs} Pollux jobs) + {args.llm_jobs} LLM "
                        f"jobs on {args.cluster}; JCT and makespan in hours")
    for column in ("policy", "plans", "finished", "failed", "avg JCT", "p99 JCT", "makespan",
                   "LLM avg JCT", "Pollux avg JCT", "restarts/job", "sim s"):
        table.add_column(column, justify="right")
    for r in runs:
        s = r["summary"]
        table.add_row(s["policy"], s["mode"], str(s["finished"]), str(s["failed"]),
                      _hours(s["avg_jct_s"]), _hours(s["p99_jct_s"]), _hours(s["makespan_s"]),
                      _hours(s["llm_avg_jct_s"]), _hours(s["pollux_avg_jct_s"]),
                      f"{s['restarts_per_job']:.2f}", f"{s['seconds']:.0f}")
    console.print(table)
    by_key = {(r["summary"]["policy"], r["summary"]["mode"]): r for r in runs}
    ratios = {}
    for policy in args.policies.split(","):
        chosen, fixed = by_key.get((policy, "search")), by_key.get((policy, "default"))
        if chosen and fixed:
            ratio = {k: chosen["summary"][k] / fixed["summary"][k]
                     for k in ("avg_jct_s", "p99_jct_s", "makespan_s", "llm_avg_jct_s")}
            ratios[policy] = ratio
            console.print(f"{policy}: plans chosen / fixed default plan: "
                          + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
    for policy in args.policies.split(","):
        modes = [m for m in args.modes.split(",") if (policy, m) in by_key]
        jobs = Table(title=f"{policy}: LLM jobs (JCT h; allocation and plan held longest)")
        jobs.add_column("job")
        for mode in modes:
            jobs.add_column(f"{mode} JCT", justify="right")
            jobs.add_column(f"{mode} plan")
        names = [j["name"] for j in by_key[(policy, modes[0])]["llm_jobs"]]
        for name in names:
            cells = [name]
            for mode in modes:
                r = by_key[(policy, mode)]
                row = next(j for j in r["llm_jobs"] if j["name"] == name)
                cells += [_hours(row["jct_s"]) if row["jct_s"] is not None
                          else (row["failure"] or "-")[:40],
                          _usual_plan(r["plans"].get(name, []))]
            jobs.add_row(*cells)
        console.print(jobs)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": "bench/llm_mix.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
            if k not in ("json", "profiles", "jobs")),
        "llm_kinds": [list(k) for k in LLM_KINDS],
        "ratios_search_over_default": ratios,
        "runs": runs,
    }, indent=1, default=str))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
