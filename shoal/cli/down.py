"""``shoal down``: stop the service; running jobs checkpoint and resume at the next ``up``."""

from __future__ import annotations

import click

from shoal.cli.client import home_option
from shoal.service.config import shoal_home
from shoal.service.launch import LaunchError, stop


@click.command("down")
@home_option
def down_command(home: str | None) -> None:
    """Stop the scheduler service (jobs are checkpointed and resumed by the next `shoal up`)."""
    folder = shoal_home(home)
    try:
        stopped = stop(folder)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("shoal stopped" if stopped else f"no shoal service was running for {folder}")
