"""``shoal cancel JOB``: stop a job for good."""

from __future__ import annotations

import click

from shoal.cli.client import Client, home_option


@click.command("cancel")
@home_option
@click.argument("jobs", nargs=-1, required=True)
def cancel_command(home: str | None, jobs: tuple[str, ...]) -> None:
    """Cancel JOB(s): their replicas stop and they are marked failed ("cancelled by user")."""
    client = Client(home)
    for job in jobs:
        data = client.post(f"/api/jobs/{job}/cancel")
        click.echo(f"{data['name']}: {data['state']} ({data.get('failure') or ''})")
