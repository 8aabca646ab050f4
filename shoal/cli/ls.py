"""``shoal ls``: the jobs as a table."""

from __future__ import annotations

import json

import click

from shoal.cli.client import Client, home_option
from shoal.cli.console import output_console
from shoal.cli.views import jobs_table


@click.command("ls")
@home_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw list as JSON.")
def ls_command(home: str | None, as_json: bool) -> None:
    """List jobs: state, replicas, batch size, progress, goodput, ETA."""
    jobs = Client(home).get("/api/jobs")
    if as_json:
        click.echo(json.dumps(jobs, indent=2))
        return
    if not jobs:
        click.echo("no jobs; submit one with `shoal submit JOB.yaml`")
        return
    output_console().print(jobs_table(jobs))
