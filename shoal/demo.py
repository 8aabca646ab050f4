"""``make demo``: the example jobs on a local shoal service, resized as they come and go.

Starts a service in a temporary SHOAL_HOME, submits ``examples/*/job.yaml`` (those profiled as
they run, not the ones that declare their model) with staggered arrivals, shows live progress,
waits for every job, prints a summary (JCT, resizes, goodput), writes an HTML/PNG/JSON report
and stops the service. Then it replays the run in the simulator from the profiles the jobs
measured (``shoal.service.replay``) and prints the simulator's average JCT next to the real one.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from shoal.cli.console import output_console
from shoal.cli.views import cluster_line, jobs_table
from shoal.policy.registry import POLICIES, tuned_policy
from shoal.service import replay, report
from shoal.service.launch import start_background, stop
from shoal.spec.errors import SpecError
from shoal.spec.job import load_job_yaml

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m shoal.demo", description=__doc__)
    parser.add_argument("--policy", choices=sorted(POLICIES), default="pollux")
    parser.add_argument("--slots", type=int, default=4,
                        help="CPU slots of one thread each (oversubscribed on 2 cores: fine)")
    parser.add_argument("--stagger", type=float, default=30.0, help="seconds between arrivals")
    parser.add_argument("--epochs-scale", type=int, default=4,
                        help="train each example this many times its epochs, so that jobs "
                             "overlap and a resize pays for its restart")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds per round")
    parser.add_argument("--home", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "demo")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--jobs", nargs="*", type=Path, default=None,
                        help="job YAMLs (default: examples/*/job.yaml, except jobs that declare "
                             "a model)")
    parser.add_argument("--backend", choices=["local", "ray"], default="local",
                        help="ray: run the jobs on a Ray cluster (see docs/ray.md)")
    parser.add_argument("--address", default=None,
                        help="ray: the cluster to join (default: start a one-node cluster)")
    parser.add_argument("--knob", action="append", default=[], metavar="KEY=VALUE",
                        help="change a knob of the shoal policy (repeatable)")
    args = parser.parse_args(argv)
    try:
        tuned_policy(args.policy, args.knob)
    except SpecError as exc:
        parser.error(str(exc))
    return args


def _summary_table(summary: dict) -> Table:
    table = Table(title="summary", header_style="bold")
    for column in ("job", "state", "JCT s", "queued s", "resizes", "max replicas", "last batch",
                   "goodput/s"):
        table.add_column(column, justify="left" if column in ("job", "state") else "right")
    for job in summary["jobs"]:
        table.add_row(
            job["name"], job["state"],
            "-" if job["jct_s"] is None else f"{job['jct_s']:.0f}",
            "-" if job["queued_s"] is None else f"{job['queued_s']:.0f}",
            str(job["resizes"]), str(job["max_replicas_used"]),
            str(job["final_batch_size"] or "-"),
            "-" if not job["goodput"] else f"{job['goodput']:.0f}",
        )
    return table


def scale_epochs(job_yaml: str, factor: int) -> str:
    """A job file with ``factor`` times its epochs: ``target_epochs`` and the ``--epochs``
    argument the example scripts take."""
    def times(match: re.Match[str]) -> str:
        return f"{match.group(1)}{int(match.group(2)) * factor}"

    job_yaml = re.sub(r"^(target_epochs:\s*)(\d+)", times, job_yaml, flags=re.MULTILINE)
    return re.sub(r'("--epochs",\s*")(\d+)', times, job_yaml)


def profiled_examples() -> list[Path]:
    """The example jobs the replay can rebuild from measurements: not those that declare their
    model (they are planned, and report no step-time profile)."""
    return [path for path in sorted((REPO / "examples").glob("*/job.yaml"))
            if load_job_yaml(path.read_text(), str(path)).model is None]


def run(args: argparse.Namespace) -> int:
    console = output_console()
    files = args.jobs or profiled_examples()
    if not files:
        console.print("[red]no job files found under examples/[/]")
        return 1
    scratch = None
    if args.home is None:
        scratch = tempfile.TemporaryDirectory(prefix="shoal-demo-")
        home = Path(scratch.name)
    else:
        home = args.home
    console.print(f"starting shoal (policy {args.policy}, {args.slots} CPU slots, home {home})")
    ray_options = {} if args.backend == "local" else {"backend": "ray", "address": args.address}
    url, _ = start_background(home, policy=args.policy, slots=args.slots, cores_per_slot=1,
                              interval=args.interval, checkpoint_interval=30.0,
                              restart_delay=30.0, knob=args.knob, **ray_options)
    http = httpx.Client(base_url=url, timeout=30)
    try:
        summary, jobs, cluster = _drive(console, http, files, args)
    finally:
        console.print("stopping the service")
        stop(home)
        http.close()
    console.print(_summary_table(summary))
    avg = summary["avg_jct_s"]
    console.print(
        f"average JCT {avg:.0f} s · makespan {summary['makespan_s']:.0f} s · "
        f"{summary['total_resizes']} resizes · {summary['finished']} finished, "
        f"{summary['failed']} failed" if avg is not None else "no job finished"
    )
    paths = report.write(summary, args.out, f"shoal demo ({args.policy})")
    console.print(f"report: {paths['html']} ({paths['png'].name}, {paths['json'].name})")
    _replay(console, jobs, cluster, args.out)
    if scratch is not None:
        scratch.cleanup()
    return 0 if summary["failed"] == 0 and summary["finished"] == len(files) else 1


def _replay(console: Console, jobs: list[dict], cluster: dict, out: Path) -> None:
    """The simulator's prediction of this run, from the profiles the jobs measured."""
    try:
        run = replay.export_run(jobs, cluster, out / "profiles")
        comparison = replay.compare(run, replay.simulate_run(run))
    except ValueError as exc:
        console.print(f"[yellow]no simulator replay: {exc}[/]")
        return
    (out / "replay.json").write_text(json.dumps(comparison, indent=2))
    sim = comparison["sim_avg_jct_s"]
    costs = run.costs
    console.print(
        f"simulator replay (same policy, measured profiles; starts {costs.start_delay:.1f} s, "
        f"resizes {costs.resize_overlap:.1f} s overlapped + {costs.restart_delay:.1f} s): "
        + (f"average JCT {sim:.0f} s vs {comparison['real_avg_jct_s']:.0f} s real "
           f"({100 * comparison['error']:+.0f}%)" if sim is not None else "a job did not finish")
        + f" -> {out / 'replay.json'}"
    )
    console.print(f"what-if under other policies: shoal replay {out / 'profiles'} "
                  "--policy pollux,shoal")


def _drive(console: Console, http: httpx.Client, files: list[Path],
           args) -> tuple[dict, list[dict], dict]:
    started = time.monotonic()
    pending = list(files)
    next_arrival = started
    deadline = started + args.timeout
    jobs: list[dict] = []
    with Live(console=console, refresh_per_second=2) as live:
        while True:
            now = time.monotonic()
            if pending and now >= next_arrival:
                path = pending.pop(0)
                response = http.post("/api/jobs",
                                     content=scale_epochs(path.read_text(), args.epochs_scale),
                                     headers={"content-type": "application/yaml"},
                                     params={"workdir": str(REPO)})
                if response.status_code != 201:
                    console.print(f"[red]{path}: {response.json()['detail']}[/]")
                next_arrival = now + args.stagger
            jobs = http.get("/api/jobs").json()
            cluster = http.get("/api/cluster").json()
            waiting = f"{len(pending)} job(s) still to arrive" if pending else "all submitted"
            live.update(Group(
                cluster_line(cluster),
                Text(f"elapsed {now - started:.0f} s · {waiting}"),
                jobs_table(jobs),
            ))
            if not pending and jobs and all(j["state"] in ("finished", "failed") for j in jobs):
                break
            if now > deadline:
                console.print("[red]timed out; stopping[/]")
                break
            time.sleep(1.0)
    return report.summarize(jobs), jobs, http.get("/api/cluster").json()


def main(argv: list[str] | None = None) -> None:
    raise SystemExit(run(parse_args(argv)))


if __name__ == "__main__":
    main()
