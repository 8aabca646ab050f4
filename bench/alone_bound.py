"""How much of a workload's average JCT any policy could still remove: every job run alone.

    .venv/bin/python bench/alone_bound.py [--workloads 1-8] [--cluster pollux-t4-64]
        [--profiles PATH] [--policies pollux,shoal] [--jobs 2] [--json out/alone_bound.json]
        [--table bench/results/policy_comparison_1-8.json]

``--profiles`` defaults to the cluster preset's, as in ``bench/policy_comparison.py``.

For every job of a workload, the simulator runs it with the cluster to itself, arriving at
time 0, once under each of ``--policies`` (each adapts its size and batch size as it would
among other jobs, exploring from one device), and once at every single-node power-of-two size
and every whole-node count of every device type at the job's own batch size (no exploration,
one start). A job's *alone JCT* is the shortest of those runs. The mean over a workload's jobs
is what its average JCT would be if no job ever waited for another, or lost devices to one,
and the policy's choices alone were as good as these: a floor that the policies compared here
reach only without contention. It is not a proof of a lower bound: a clairvoyant policy could
skip exploration or adapt batch sizes better than any of these runs.

With ``--table`` (the JSON ``bench/policy_comparison.py`` writes), each workload's row also
gives the policies' average JCT from that table and, for a target ``--target`` x
``--reference`` (default 0.80 x pollux), the share of ``--policy``'s contention delay (its
average JCT above the alone mean) that the target asks to remove.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

from comparison_table import from_base
from policy_comparison import DATA, profiles_for, workload_numbers
from rich.console import Console
from rich.table import Table


def _sizes(per_node: int, nodes: int) -> list[int]:
    """Sia's configurations: single-node powers of two, then whole nodes."""
    single = [1 << k for k in range(per_node.bit_length()) if 1 << k <= per_node]
    return sorted(set(single) | {per_node * n for n in range(1, nodes + 1)})


@cache
def _jobs(workload: str) -> dict:
    """A workload's jobs by name, read once per worker process."""
    from shoal.spec import load_workload_csv

    return {job.name: job for job in load_workload_csv(workload)}


@cache
def _cluster(name: str):
    from shoal.spec import load_cluster

    return load_cluster(name)


@cache
def _library(profiles: str):
    """One profile library per worker process, so each application's profile is parsed once."""
    from shoal.backends.sim.profile import ProfileLibrary

    return ProfileLibrary(profiles)


def alone_jcts(task: dict[str, Any]) -> dict[str, Any]:
    """One job's JCT alone on the cluster: under each policy and at each fixed size."""
    from shoal.backends.sim.isolated import isolated_jct
    from shoal.backends.sim.run import simulate
    from shoal.policy.registry import tuned_policy

    spec = _jobs(task["workload"])[task["name"]]
    alone = spec.model_copy(update={"submit_time": 0.0})
    cluster, library = _cluster(task["cluster"]), _library(task["profiles"])
    out: dict[str, Any] = {"name": spec.name, "application": spec.application, "runs": {}}
    limits = None
    for policy in task["policies"]:
        result = simulate([alone], tuned_policy(policy, {}), cluster, library,
                          interval=task["interval"], restart_delay=task["restart_delay"])
        record = result.records[0]
        limits = record.limits  # the job's limits as the simulator derived them
        if record.finish_time is not None:
            out["runs"][policy] = record.finish_time - record.spec.submit_time
    if limits is None:
        raise SystemExit("--policies: name at least one policy (its run gives the job's limits)")
    app = library.get(spec.application)
    batch = spec.batch_size or limits.init_batch_size
    for group in cluster.nodes:
        if group.device_type not in app.devices:
            continue
        for devices in _sizes(group.devices_per_node, group.count):
            try:
                out["runs"][f"{group.device_type}x{devices}"] = isolated_jct(
                    app, limits, batch, devices, group.devices_per_node, group.device_type,
                    task["restart_delay"], spec.target_epochs)
            except ValueError:  # a size the profile does not cover
                continue
    out["alone_jct_s"] = min(out["runs"].values())
    out["best"] = min(out["runs"], key=out["runs"].get)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="1-8")
    parser.add_argument("--cluster", default="pollux-t4-64")
    parser.add_argument("--profiles", default=None)
    parser.add_argument("--policies", default="pollux,shoal")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--restart-delay", type=float, default=30.0)
    parser.add_argument("--table", type=Path, default=None)
    parser.add_argument("--policy", default="shoal")
    parser.add_argument("--reference", default="pollux")
    parser.add_argument("--target", type=float, default=0.80)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        parser.error("--policies: name at least one policy (its run gives each job's limits)")
    args.profiles = args.profiles or profiles_for(args.cluster)
    tasks = []
    for number in workload_numbers(args.workloads):
        path = str(DATA / "workloads" / f"workload-{number}.csv")
        tasks += [{"workload": path, "name": name, "cluster": args.cluster,
                   "profiles": args.profiles, "policies": policies, "interval": args.interval,
                   "restart_delay": args.restart_delay, "number": number}
                  for name in _jobs(path)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(alone_jcts, tasks, chunksize=4))
    for task, result in zip(tasks, results, strict=True):
        result["workload"] = f"workload-{task['number']}"

    averages = _table_averages(args.table, args.cluster) if args.table else {}
    rows = []
    for number in workload_numbers(args.workloads):
        name = f"workload-{number}"
        jobs = [r for r in results if r["workload"] == name]
        row: dict[str, Any] = {
            "workload": name,
            "jobs": len(jobs),
            "alone_avg_jct_s": statistics.fmean(r["alone_jct_s"] for r in jobs),
        }
        for policy in policies:
            row[f"{policy}_alone_avg_jct_s"] = statistics.fmean(
                r["runs"].get(policy, float("nan")) for r in jobs)
        for policy, value in averages.get(name, {}).items():
            row[f"{policy}_avg_jct_s"] = value
        row.update(_target_share(row, args.policy, args.reference, args.target))
        rows.append(row)
    _print(rows, policies, args)
    out = {"cluster": args.cluster, "profiles": args.profiles, "policies": policies,
           "target": {"policy": args.policy, "reference": args.reference, "ratio": args.target},
           "workloads": rows, "jobs": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out))
    return out


def _table_averages(path: Path, cluster: str) -> dict[str, dict[str, float]]:
    """Per workload and policy, the average JCT on ``cluster`` in a comparison table: the JSON
    ``bench/policy_comparison.py --json`` writes (its ``runs``) or a published one
    (``bench/results/policy_comparison_1-8.json``: per cluster, policy and workload)."""
    table = json.loads(path.read_text())
    out: dict[str, dict[str, float]] = {}
    if "runs" in table:
        for run in table["runs"]:
            if run["cluster"] == cluster:
                out.setdefault(run["workload"], {})[run["policy"]] = run["avg_jct_s"]
    else:
        for (where, policy, workload), summary in from_base(table, {}).items():
            if where == cluster:
                out.setdefault(workload, {})[policy] = summary["avg_jct_s"]
    if not out:
        raise SystemExit(f"--table {path}: no runs on {cluster}; run bench/policy_comparison.py "
                         f"--clusters {cluster} --json {path} first")
    return out


def _target_share(row: dict[str, Any], policy: str, reference: str, target: float
                  ) -> dict[str, float]:
    """The target's average JCT and the share of ``policy``'s delay above alone it removes."""
    have, ref = row.get(f"{policy}_avg_jct_s"), row.get(f"{reference}_avg_jct_s")
    if have is None or ref is None:
        return {}
    floor = row["alone_avg_jct_s"]
    goal = target * ref
    return {"target_avg_jct_s": goal,
            "delay_to_remove": (have - goal) / (have - floor) if have > floor else float("nan")}


def _print(rows: list[dict[str, Any]], policies: list[str], args: argparse.Namespace) -> None:
    """Alone means, then the table's averages of ``--policy`` and ``--reference`` (the JSON
    keeps every policy of the table), the target and the share of the delay it removes."""
    table = Table(title=f"Average JCT (s) with every job alone on {args.cluster}")
    columns = ["workload", "jobs", "alone_avg_jct_s"]
    columns += [f"{p}_alone_avg_jct_s" for p in policies]
    columns += [f"{args.policy}_avg_jct_s", f"{args.reference}_avg_jct_s", "target_avg_jct_s",
                "delay_to_remove"]
    columns = [c for c in dict.fromkeys(columns) if any(c in row for row in rows)]
    headers = {"alone_avg_jct_s": "alone", "target_avg_jct_s": f"{args.target} x {args.reference}",
               **{f"{p}_alone_avg_jct_s": f"{p} alone" for p in policies},
               **{f"{p}_avg_jct_s": p for p in (args.policy, args.reference)}}
    for column in columns:
        table.add_column(headers.get(column, column.replace("_", " ")), justify="right")
    for row in rows:
        table.add_row(*[_cell(row.get(c)) for c in columns])
    means = {c: statistics.fmean(row[c] for row in rows) for c in columns[2:]
             if all(isinstance(row.get(c), float) for row in rows)}
    table.add_row("mean", "", *[_cell(means.get(c)) for c in columns[2:]])
    Console(width=160).print(table)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"
    return "-" if value is None else str(value)


if __name__ == "__main__":
    main()
