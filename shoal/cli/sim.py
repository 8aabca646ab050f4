"""``shoal sim``: run workloads through the scheduler core on the simulator."""

from __future__ import annotations

import json
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shoal.cli.console import output_console
from shoal.perf.planned import PLAN_MODES
from shoal.policy.registry import POLICIES
from shoal.spec.cluster import ClusterSpec, preset_names
from shoal.spec.errors import SpecError

SUMMARY_COLUMNS = [
    ("avg JCT (s)", "avg_jct_s", "{:.0f}"),
    ("median (s)", "median_jct_s", "{:.0f}"),
    ("p99 (s)", "p99_jct_s", "{:.0f}"),
    ("queued (s)", "avg_queued_s", "{:.0f}"),
    ("makespan (s)", "makespan_s", "{:.0f}"),
    ("util", "utilization", "{:.2f}"),
    ("dev-h/job", "device_hours_per_job", "{:.2f}"),
    ("restarts/job", "restarts_per_job", "{:.2f}"),
    ("worst FTF", "worst_ftf", "{:.2f}"),
    ("decide p50 (ms)", "median_decision_ms", "{:.1f}"),
]


def _workloads(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(path.glob("*.csv"))
        if not found:
            raise SpecError(f"no *.csv workloads in directory {path}", field="workload")
        return found
    if not path.exists():
        raise SpecError(f"workload file {path} does not exist", field="workload")
    return [path]


def run_one(task: dict[str, Any]) -> dict[str, Any]:
    """Simulate one (workload, policy) pair; runs in a worker process when parallel."""
    from shoal.backends.sim.profile import ProfileLibrary
    from shoal.backends.sim.run import simulate
    from shoal.metrics.report import summarize
    from shoal.policy.registry import is_shoal, tuned_policy
    from shoal.spec import load_cluster, load_workload_csv

    jobs = load_workload_csv(task["workload"])
    knobs = task.get("knobs") or {}
    name = task["policy"]
    policy = tuned_policy(name, knobs if is_shoal(name) else {})
    result = simulate(
        jobs,
        policy,
        load_cluster(task["cluster"]),
        ProfileLibrary(task["profiles"]),
        interval=task["interval"],
        restart_delay=task["restart_delay"],
        seed=task["seed"],
        plan_mode=task.get("plan_mode", "search"),
        time_resolution=task.get("time_resolution", 1.0),
    )
    report = summarize(result)
    report["workload"] = Path(task["workload"]).stem
    report["summary"]["workload"] = report["workload"]
    return report


def _fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return pattern.format(value)


def _by_policy(reports: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for policy in dict.fromkeys(r["summary"]["policy"] for r in reports):
        rows = [r["summary"] for r in reports if r["summary"]["policy"] == policy]
        agg: dict[str, float] = {}
        for _, key, _ in SUMMARY_COLUMNS:
            vals = [row[key] for row in rows if row.get(key) is not None]
            if vals:
                agg[key] = max(vals) if key == "worst_ftf" else statistics.fmean(vals)
        agg["workloads"] = len(rows)
        out[policy] = agg
    return out


def _check_profiles_cover(cluster: ClusterSpec, profile_dir: Path) -> None:
    """Refuse a cluster whose device types no profile in ``profile_dir`` measures, naming a
    directory at hand that does (the heterogeneous presets need ``data/profiles-hetero``).
    Only profiled jobs need this: jobs that declare a model are planned, not profiled."""
    from shoal.backends.sim.locate import profile_dirs
    from shoal.backends.sim.profile import ProfileLibrary

    wanted = {group.device_type for group in cluster.nodes}
    missing = sorted(wanted - ProfileLibrary(profile_dir).measured_device_types())
    if not missing:
        return
    fix = "pass --profiles DIR with profiles of those types"
    for candidate in profile_dirs():
        if wanted <= ProfileLibrary(candidate).measured_device_types():
            fix += f", e.g. --profiles {os.path.relpath(candidate)}"
            break
    raise SpecError(f"no profile in {profile_dir} measures the cluster's device types {missing}; "
                    f"{fix}", field="profiles")


@click.command("sim")
@click.option("--workload", "workload", required=True, type=click.Path(path_type=Path),
              help="workload CSV, or a directory: every *.csv in it is run")
@click.option("--policy", default="pollux", show_default=True,
              help="policy name or comma-separated names: " + ", ".join(POLICIES))
@click.option("--cluster", default="pollux-t4-64", show_default=True,
              help="cluster preset name (" + ", ".join(preset_names()) + ") or YAML file")
@click.option("--profiles", type=click.Path(path_type=Path), default=None,
              help="profile directory (default: $SHOAL_PROFILES or shared/data/pollux/traces, "
                   "T4 only; the mixed presets need data/profiles-hetero)")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None,
              help="write the report here ('-' for stdout)")
@click.option("--plot", "plot_out", type=click.Path(path_type=Path), default=None,
              help="write a JCT CDF / allocation plot (PNG) here")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--interval", default=60.0, show_default=True, type=float,
              help="scheduling round length in seconds")
@click.option("--restart-delay", default=30.0, show_default=True, type=float,
              help="seconds a job loses at every (re)start")
@click.option("--jobs", "parallel", default=1, show_default=True, type=int,
              help="simulations run in parallel processes")
@click.option("--knob", "knobs", multiple=True, metavar="KEY=VALUE",
              help="override a knob of the shoal policies (ShoalKnobs), e.g. restart_delay=30; "
                   "repeatable")
@click.option("--plan-mode", type=click.Choice(PLAN_MODES), default="search", show_default=True,
              help="how jobs that declare a model pick their parallel plan per allocation")
@click.option("--time-resolution", default=1.0, show_default=True,
              type=click.FloatRange(min=0.0),
              help="epochs end on multiples of this many seconds (1: as the Pollux simulator; "
                   "0: exact, for profiles whose epochs take under a few seconds)")
def sim_command(workload, policy, cluster, profiles, json_out, plot_out, seed, interval,
                restart_delay, parallel, knobs, plan_mode, time_resolution) -> None:
    """Simulate a workload trace under one or more policies and compare them."""
    from shoal.backends.sim.locate import default_profiles
    from shoal.policy.registry import select_policies
    from shoal.spec import load_cluster, load_workload_csv

    to_stdout = json_out == Path("-")
    console = output_console(stderr=to_stdout)
    try:
        policies, overrides = select_policies(policy, knobs)
        cluster_spec = load_cluster(cluster)
        profile_dir = profiles or default_profiles()
        if not Path(profile_dir).is_dir():
            raise SpecError(f"profile directory {profile_dir} does not exist", field="profiles")
        files = _workloads(workload)
        if any(spec.kind == "train" and spec.model is None
               for f in files for spec in load_workload_csv(f)):
            _check_profiles_cover(cluster_spec, Path(profile_dir))
    except SpecError as exc:
        raise click.UsageError(str(exc)) from exc
    tasks = [
        {"workload": str(f), "policy": p, "cluster": cluster, "profiles": str(profile_dir),
         "interval": interval, "restart_delay": restart_delay, "seed": seed,
         "knobs": overrides, "plan_mode": plan_mode, "time_resolution": time_resolution}
        for f in files for p in policies
    ]
    reports: list[dict[str, Any]] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total}"), TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("simulating", total=len(tasks))
        if parallel > 1 and len(tasks) > 1:
            with ProcessPoolExecutor(max_workers=parallel) as pool:
                for report in pool.map(run_one, tasks):
                    reports.append(report)
                    progress.advance(bar)
        else:
            for task in tasks:
                progress.update(bar, description=f"{Path(task['workload']).stem} / "
                                f"{task['policy']}")
                reports.append(run_one(task))
                progress.advance(bar)

    table = Table(title=f"shoal sim on {cluster}")
    table.add_column("workload")
    table.add_column("policy")
    for title, _, _ in SUMMARY_COLUMNS:
        table.add_column(title, justify="right")
    for report in reports:
        s = report["summary"]
        table.add_row(report["workload"], s["policy"],
                      *(_fmt(s.get(k), f) for _, k, f in SUMMARY_COLUMNS))
    by_policy = _by_policy(reports)
    if len(files) > 1:
        for name, agg in by_policy.items():
            cells = (_fmt(agg.get(k), f) for _, k, f in SUMMARY_COLUMNS)
            table.add_row("[b]mean[/b]", name, *cells)
    console.print(table)

    if json_out is not None:
        payload = reports[0] if len(reports) == 1 else {"runs": reports, "by_policy": by_policy}
        text = json.dumps(payload, indent=2, default=str)
        if json_out == Path("-"):
            click.echo(text)
        else:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(text)
            console.print(f"wrote {json_out}")
    if plot_out is not None:
        from shoal.metrics.report import plot_comparison

        first = reports[0]["workload"]
        chosen = {r["summary"]["policy"]: r for r in reports if r["workload"] == first}
        console.print(f"wrote {plot_comparison(chosen, plot_out)}")
