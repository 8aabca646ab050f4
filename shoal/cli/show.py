"""``shoal show JOB``: one job in detail."""

from __future__ import annotations

import datetime
import json

import click
from rich.console import Console
from rich.table import Table

from shoal.cli.client import Client, home_option
from shoal.cli.console import output_console
from shoal.perf.planned import describe_plan


def _clock(t: float | None) -> str:
    return "-" if t is None else datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S")


@click.command("show")
@home_option
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the raw record as JSON.")
def show_command(home: str | None, job: str, as_json: bool) -> None:
    """Allocation history, throughput model, batch size, progress and ETA of JOB."""
    client = Client(home)
    data = client.get(f"/api/jobs/{job}")
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    console = output_console()
    if data.get("kind", "train") != "train":
        _show_service(console, data)
        return
    alloc = data.get("allocation") or {}
    eta = data.get("eta_seconds")
    facts = Table.grid(padding=(0, 2))
    for key, value in [
        ("job", data["name"]),
        ("state", data["state"] + (f" ({data['failure']})" if data.get("failure") else "")),
        ("application", data["application"]),
        ("allocation", f"{alloc.get('replicas', 0)} x {alloc.get('device_type', '-')}"),
        ("batch size", data.get("batch_size") or "-"),
        *([("parallel plan", describe_plan(data["plan"]))] if data.get("plan") else []),
        ("progress", f"{float(data.get('progress') or 0):.1%} (epoch {data.get('epoch', 0)})"),
        ("ETA", "-" if eta is None else f"{eta:.0f} s"),
        ("goodput", f"{data['goodput']:.1f} samples/s" if data.get("goodput") else "-"),
        ("noise scale", f"{data['noise_scale']:.0f}" if data.get("noise_scale") else "-"),
        ("restarts", _restarts(data)),
        ("restart cost", "-" if data.get("restart_seconds") is None
         else f"{data['restart_seconds']:.1f} s per restart (measured)"),
        ("device-seconds", f"{data['device_seconds']:.0f}"),
        ("submitted / started / ended",
         f"{_clock(data['submit_time'])} / {_clock(data['start_time'])} / "
         f"{_clock(data['finish_time'])}"),
        ("throughput model", json.dumps(data.get("perf_params")) if data.get("perf_params")
         else "not fitted yet"),
        ("command", " ".join(data["spec"].get("command") or [])),
    ]:
        facts.add_row(f"[bold]{key}[/]", str(value))
    console.print(facts)
    _history(console, data)
    profile = data.get("profile") or []
    if profile:
        table = Table(title="measured step times", header_style="bold")
        for column in ("replicas", "local_bsz", "accum", "step s", "sync s", "steps"):
            table.add_column(column, justify="right")
        for row in profile:
            table.add_row(str(row["num_replicas"]), str(row["local_bsz"]),
                          str(row["accum_steps"]), f"{row['step_time']:.4f}",
                          f"{row['sync_time']:.4f}", str(row["count"]))
        console.print(table)


def _restarts(data: dict) -> str:
    """Restarts the scheduler made, and apart from them the crash retries, which it did not."""
    retries = sum(1 for run in data.get("run_details") or [] if run.get("kind") == "retry")
    extra = f", crash retries {retries}" if retries else ""
    return f"{data['num_restarts']} (resizes {data.get('resizes', 0)}{extra})"


def _history(console: Console, data: dict) -> None:
    history = Table(title="allocation history", header_style="bold")
    history.add_column("time")
    history.add_column("replicas", justify="right")
    for entry in data["history"]:
        history.add_row(_clock(entry["time"]), str(entry["replicas"]))
    console.print(history)


def _show_service(console: Console, data: dict) -> None:
    """A serve / stream job: its service measurements instead of training progress."""
    service = data.get("service") or {}
    alloc = data.get("allocation") or {}

    def number(key: str, pattern: str, scale: float = 1.0) -> str:
        value = service.get(key)
        return "-" if value is None else pattern.format(scale * value)

    facts = Table.grid(padding=(0, 2))
    rows = [
        ("job", data["name"]),
        ("kind", data["kind"]),
        ("state", data["state"] + (f" ({data['failure']})" if data.get("failure") else "")),
        ("model", data["application"]),
        ("allocation", f"{alloc.get('replicas', 0)} x {alloc.get('device_type', '-')}"),
        ("replicas ready", service.get("replicas", 0)),
        ("URL", service.get("url") or "-"),
    ]
    if data["kind"] == "stream":
        rows += [
            ("input rate", number("input_rate", "{:.2f} samples/s")),
            ("processed", service.get("processed") or 0),
            ("backlog", number("backlog", "{:.0f} samples")),
            ("lag", f"{number('lag_s', '{:.1f} s')} (max {number('max_lag_s', '{:.1f} s')}, "
                    f"bound {number('lag_bound_s', '{:.0f} s')})"),
            ("device speed", f"{number('device_speed', '{:.1f} samples/s')} measured on "
                             f"{service.get('device_type') or '-'}"),
        ]
    else:
        rows += [
            ("arrival rate", number("arrival_rate", "{:.2f} requests/s")),
            ("requests answered", service.get("requests", 0)),
            ("SLO", number("slo_s", "{:.0f} ms", 1000.0)),
            ("SLO attainment", number("slo_attainment", "{:.2%}")),
            ("p99 latency", number("p99_latency_s", "{:.0f} ms", 1000.0)),
        ]
    rows += [
        ("resizes", data.get("resizes", 0)),
        ("device-seconds", f"{data['device_seconds']:.0f}"),
        ("submitted / started / ended",
         f"{_clock(data['submit_time'])} / {_clock(data['start_time'])} / "
         f"{_clock(data['finish_time'])}"),
    ]
    for key, value in rows:
        facts.add_row(f"[bold]{key}[/]", str(value))
    console.print(facts)
    _history(console, data)
