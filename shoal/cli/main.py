"""Entry point of the ``shoal`` command; each command lives in its own module."""

from __future__ import annotations

import click

from shoal import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shoal")
def cli() -> None:
    """shoal: demand-aware scheduling of deep-learning jobs on shared clusters."""


def _register() -> None:
    from shoal.cli.sim import sim_command

    cli.add_command(sim_command)
    # Further commands are registered below, one line each.
    cli.add_command(__import__("shoal.cli.up", fromlist=["x"]).up_command)
    cli.add_command(__import__("shoal.cli.down", fromlist=["x"]).down_command)
    cli.add_command(__import__("shoal.cli.submit", fromlist=["x"]).submit_command)
    cli.add_command(__import__("shoal.cli.ls", fromlist=["x"]).ls_command)
    cli.add_command(__import__("shoal.cli.show", fromlist=["x"]).show_command)
    cli.add_command(__import__("shoal.cli.logs", fromlist=["x"]).logs_command)
    cli.add_command(__import__("shoal.cli.cancel", fromlist=["x"]).cancel_command)
    cli.add_command(__import__("shoal.cli.top", fromlist=["x"]).top_command)
    cli.add_command(__import__("shoal.cli.serve", fromlist=["x"]).serve_sim_command)
    cli.add_command(__import__("shoal.cli.serve", fromlist=["x"]).loadgen_command)
    cli.add_command(__import__("shoal.cli.plan", fromlist=["plan_command"]).plan_command)


_register()
