"""``shoal logs JOB [-f]``: a replica's output (rank 0 by default)."""

from __future__ import annotations

import time

import click

from shoal.cli.client import Client, home_option

_DONE = ("finished", "failed")


@click.command("logs")
@home_option
@click.argument("job")
@click.option("--rank", type=int, default=0, show_default=True, help="Which replica.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
def logs_command(home: str | None, job: str, rank: int, follow: bool) -> None:
    """Print JOB's log (every attempt, each headed by a `=== shoal: attempt N` line)."""
    client = Client(home)
    offset = 0
    while True:
        response = client.http.get(f"/api/jobs/{job}/logs", params={"rank": rank,
                                                                     "offset": offset})
        if response.status_code >= 400:
            raise click.ClickException(response.json().get("detail", response.text))
        click.echo(response.text, nl=False)
        offset = int(response.headers.get("X-Next-Offset", offset))
        if not follow:
            return
        if not response.text:
            if client.get(f"/api/jobs/{job}")["state"] in _DONE:
                return
            time.sleep(1.0)
