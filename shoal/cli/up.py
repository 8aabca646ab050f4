"""``shoal up``: start the scheduler service for this SHOAL_HOME."""

from __future__ import annotations

import click

from shoal.cli.client import home_option
from shoal.policy.registry import POLICIES, tuned_policy
from shoal.service.config import shoal_home
from shoal.service.launch import LaunchError, choose_port, running_url, start_background
from shoal.spec.errors import SpecError


@click.command("up")
@home_option
@click.option("--port", type=int, default=None, help="API port on 127.0.0.1 (default: free).")
@click.option("--policy", type=click.Choice(sorted(POLICIES)), default="pollux", show_default=True)
@click.option("--interval", type=float, default=10.0, show_default=True,
              help="Seconds between scheduling rounds.")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default=None,
              help="Device pool (env SHOAL_DEVICE; auto = GPUs when CUDA works).")
@click.option("--slots", type=int, default=None,
              help="CPU slots (env SHOAL_CPU_SLOTS; default cores / cores-per-slot).")
@click.option("--cores-per-slot", type=int, default=None,
              help="Threads per replica on a CPU slot (env SHOAL_CORES_PER_SLOT; default 1).")
@click.option("--slot-memory-gb", type=float, default=None,
              help="Memory of one device in GiB, for planning jobs that declare their model "
                   "(env SHOAL_SLOT_MEMORY_GB; default the GPU's, or RAM / slots; on Ray, "
                   "the nodes' shoal.io/device-memory-gb label wins).")
@click.option("--db-url", default=None,
              help="SQLAlchemy URL of the store (default sqlite:///HOME/shoal.db).")
@click.option("--checkpoint-interval", type=float, default=30.0, show_default=True,
              help="Seconds between periodic checkpoints of running jobs.")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local",
              show_default=True, help="Run jobs on this machine or on a Ray cluster.")
@click.option("--address", default=None,
              help="ray: the cluster to join, e.g. 10.0.0.1:6379 or auto (default: start a "
                   "one-node cluster here).")
@click.option("--checkpoint-dir", default=None,
              help="ray: where jobs checkpoint; a path every node can read (default "
                   "HOME/checkpoints).")
@click.option("--max-retries", type=click.IntRange(min=0), default=3, show_default=True,
              help="Restarts of a crashed job in a row before it is marked failed (the count "
                   "resets once a restarted run reports progress).")
@click.option("--backoff", type=click.FloatRange(min=0.0), default=2.0, show_default=True,
              help="Seconds before the first restart of a crashed job; doubled for each "
                   "further one in a row.")
@click.option("--restart-delay", type=float, default=10.0, show_default=True,
              help="Seconds the policy charges for one restart (checkpoint, restore, warm-up).")
@click.option("--knob", "knobs", multiple=True, metavar="KEY=VALUE",
              help="Change a knob of the shoal policy (ShoalKnobs), e.g. alpha=0.8; "
                   "repeatable.")
@click.option("--host", default=None,
              help="Interface the API listens on (default 127.0.0.1; 0.0.0.0 lets replicas "
                   "on other machines report).")
@click.option("--foreground", is_flag=True, help="Stay attached (Ctrl-C stops the service).")
def up_command(home: str | None, port: int | None, policy: str, interval: float,
               device: str | None, slots: int | None, cores_per_slot: int | None,
               slot_memory_gb: float | None, db_url: str | None, checkpoint_interval: float,
               backend: str, max_retries: int, backoff: float,
               address: str | None, checkpoint_dir: str | None, restart_delay: float,
               knobs: tuple[str, ...], host: str | None, foreground: bool) -> None:
    """Start the scheduler service (returns once its API answers)."""
    if backend == "local" and (address or checkpoint_dir):
        raise click.UsageError("--address and --checkpoint-dir apply to --backend ray")
    try:
        tuned_policy(policy, knobs, restart_delay)  # a bad knob fails here, not in the log
    except SpecError as exc:
        raise click.UsageError(str(exc)) from exc
    folder = shoal_home(home)
    url = running_url(folder)
    if url:
        click.echo(f"shoal is already running at {url} (home {folder})")
        return
    options = {"policy": policy, "interval": interval, "device": device, "slots": slots,
               "cores_per_slot": cores_per_slot, "slot_memory_gb": slot_memory_gb,
               "db_url": db_url,
               "checkpoint_interval": checkpoint_interval, "restart_delay": restart_delay,
               "max_retries": max_retries, "backoff": backoff, "knob": list(knobs)}
    if backend != "local":
        options.update(backend=backend, address=address, checkpoint_dir=checkpoint_dir)
    if host:
        options["host"] = host
    if foreground:
        from shoal.service.__main__ import main as serve_main
        from shoal.service.config import port_path
        from shoal.service.launch import service_command

        folder.mkdir(parents=True, exist_ok=True)
        chosen = choose_port(folder, port)
        port_path(folder).write_text(str(chosen))
        click.echo(f"shoal: serving on http://127.0.0.1:{chosen} (home {folder}); Ctrl-C stops")
        serve_main(service_command(folder, chosen, options)[3:])
        return
    try:
        url, pid = start_background(folder, port, **options)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"shoal is up at {url} (pid {pid}, home {folder}); API docs at {url}/docs")
