"""``shoal submit JOB.yaml``: validate a job spec here, then hand it to the service."""

from __future__ import annotations

from pathlib import Path

import click

from shoal.cli.client import Client, home_option
from shoal.spec.errors import SpecError
from shoal.spec.job import load_job_yaml


@click.command("submit")
@home_option
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def submit_command(home: str | None, files: tuple[Path, ...]) -> None:
    """Submit job spec(s) (YAML). The job's command runs in the current directory."""
    texts = []
    for path in files:
        try:
            text = path.read_text()
        except OSError as exc:
            raise click.ClickException(f"cannot read {path}: {exc}") from exc
        try:
            load_job_yaml(text, source=str(path))
        except SpecError as exc:
            raise click.ClickException(f"rejected: {exc}") from exc
        texts.append((path, text))
    client = Client(home)
    for path, text in texts:
        job = client.submit_yaml(text, Path.cwd())
        click.echo(f"submitted {job['name']} ({path})")
