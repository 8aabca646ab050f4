"""``shoal top``: a live view of devices, jobs and goodput."""

from __future__ import annotations

import time

import click
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from shoal.cli.client import Client, home_option
from shoal.cli.views import cluster_line, jobs_table


def frame(client: Client) -> Group:
    cluster = client.get("/api/cluster")
    jobs = client.get("/api/jobs")
    goodput = sum(j.get("goodput") or 0.0 for j in jobs if j["state"] == "running")
    active = sum(1 for j in jobs if j["state"] not in ("finished", "failed"))
    summary = Text(f"{active} active job(s), total goodput {goodput:.0f} samples/s")
    return Group(cluster_line(cluster), summary, jobs_table(jobs))


@click.command("top")
@home_option
@click.option("--interval", type=float, default=1.0, show_default=True)
@click.option("--once", is_flag=True, help="Print one frame and exit.")
def top_command(home: str | None, interval: float, once: bool) -> None:
    """Live view of the cluster, the jobs and their goodput (Ctrl-C to leave)."""
    client = Client(home)
    console = Console()
    if once:
        console.print(frame(client))
        return
    try:
        with Live(frame(client), console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(frame(client))
    except KeyboardInterrupt:
        pass
