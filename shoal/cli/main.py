"""Entry point of the ``shoal`` command; each command lives in its own module."""

from __future__ import annotations

import click

from shoal import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shoal")
def cli() -> None:
    """shoal: demand-aware scheduling of deep-learning jobs on shared clusters."""


def _register() -> None:
    from shoal.cli.cancel import cancel_command
    from shoal.cli.down import down_command
    from shoal.cli.logs import logs_command
    from shoal.cli.ls import ls_command
    from shoal.cli.plan import plan_command
    from shoal.cli.replay import replay_command
    from shoal.cli.serve import loadgen_command, serve_sim_command
    from shoal.cli.show import show_command
    from shoal.cli.sim import sim_command
    from shoal.cli.submit import submit_command
    from shoal.cli.top import top_command
    from shoal.cli.up import up_command

    for command in (
        # the scheduler service and its jobs
        up_command, down_command, submit_command, ls_command, show_command, logs_command,
        cancel_command, top_command,
        # simulation and planning
        sim_command, replay_command, plan_command, serve_sim_command, loadgen_command,
    ):
        cli.add_command(command)


_register()
