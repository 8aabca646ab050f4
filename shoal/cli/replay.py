"""``shoal replay``: a real run of the service, replayed by the simulator under other policies."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
from rich.table import Table

from shoal.cli.client import Client, home_option
from shoal.cli.console import output_console
from shoal.policy.registry import is_shoal, select_policies
from shoal.service.replay import MeasuredRun, compare, export_run, simulate_run
from shoal.spec.errors import SpecError


def _load(run: Path) -> MeasuredRun:
    path = run / "run.json" if run.is_dir() else run
    if not path.is_file():
        raise click.BadParameter(f"{path} does not exist; give the folder `make demo` or "
                                 "`shoal replay --export DIR` wrote (it holds run.json)",
                                 param_hint="RUN")
    try:
        measured = MeasuredRun.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(f"{path} is not a run exported by shoal: {exc}",
                                 param_hint="RUN") from None
    # The profiles sit beside run.json, wherever the folder has been moved since.
    return dataclasses.replace(measured, profiles=path.parent)


def _export(home: str | None, out: Path) -> MeasuredRun:
    client = Client(home)
    try:
        return export_run(client.get("/api/jobs"), client.get("/api/cluster"), out)
    except ValueError as exc:
        raise click.ClickException(f"cannot export the service's run: {exc}") from None


@click.command("replay")
@click.argument("run", required=False, type=click.Path(path_type=Path))
@home_option
@click.option("--export", "export_to", type=click.Path(path_type=Path), default=None,
              help="Export the finished jobs of the running service to this folder first "
                   "(profiles and run.json), and replay them.")
@click.option("--policy", "policies", default=None,
              help="Policies to replay under, comma-separated (default: the run's own).")
@click.option("--knob", "knobs", multiple=True, metavar="KEY=VALUE",
              help="Override a knob of the shoal policies; repeatable.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None,
              help="Write the comparison here.")
def replay_command(run: Path | None, home: str | None, export_to: Path | None,
                   policies: str | None, knobs: tuple[str, ...], json_out: Path | None) -> None:
    """Replay a real run in the simulator: same jobs, arrivals, measured step times and restart
    costs, under the run's policy or others (what-if). RUN is a folder `make demo` wrote
    (`OUT/profiles`) or one `--export` wrote."""
    if (run is None) == (export_to is None):
        raise click.UsageError("give either RUN (an exported run) or --export DIR")
    measured = _load(run) if run is not None else _export(home, export_to)  # type: ignore[arg-type]
    try:
        names, overrides = select_policies(policies or measured.policy, knobs)
    except SpecError as exc:
        raise click.UsageError(str(exc)) from None
    results = {}
    for name in names:
        tuned = {**measured.policy_knobs, **overrides} if is_shoal(name) else {}
        what_if = dataclasses.replace(measured, policy=name, policy_knobs=tuned)
        results[name] = compare(what_if, simulate_run(what_if))
    _print(measured, results, overrides)
    if json_out is not None:
        json_out.write_text(json.dumps({"run_policy": measured.policy, "replays": results},
                                       indent=2))


def _print(measured: MeasuredRun, results: dict[str, dict], knobs: dict[str, object]) -> None:
    tuned = "; shoal knobs " + ", ".join(f"{k}={v}" for k, v in knobs.items()) if knobs else ""
    table = Table(title=f"replay of a run under {measured.policy} "
                        f"({len(measured.jobs)} jobs; JCT in seconds{tuned})")
    table.add_column("job")
    table.add_column(f"real ({measured.policy})", justify="right")
    for name in results:
        table.add_column(f"sim {name}", justify="right")
    simulated = {name: {row["job"]: row["sim_jct_s"] for row in result["jobs"]}
                 for name, result in results.items()}
    for job, real_jct in measured.real_jct.items():
        cells = ["failed" if simulated[n].get(job) is None else f"{simulated[n][job]:.0f}"
                 for n in results]
        table.add_row(job, f"{real_jct:.0f}", *cells)
    averages = [f"{r['sim_avg_jct_s']:.1f}" if r["sim_avg_jct_s"] is not None else "-"
                for r in results.values()]
    real = measured.real_jct.values()
    table.add_row("[bold]average[/]", f"{sum(real) / max(len(real), 1):.1f}", *averages)
    output_console().print(table)
