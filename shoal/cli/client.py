"""How CLI commands find and talk to the service of a SHOAL_HOME."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
import httpx

from shoal.service.config import read_info, shoal_home

home_option = click.option(
    "--home",
    envvar="SHOAL_HOME",
    default=None,
    help="Service home holding store, logs and checkpoints (env SHOAL_HOME; ~/.shoal).",
)


def service_url(home: str | Path | None) -> str:
    override = os.environ.get("SHOAL_URL")
    if override:
        return override.rstrip("/")
    info = read_info(shoal_home(home))
    if not info:
        raise click.ClickException(
            f"no service is running for {shoal_home(home)}; start one with `shoal up`"
        )
    return str(info["url"])


class Client:
    def __init__(self, home: str | Path | None = None, url: str | None = None,
                 timeout_s: float = 30.0):
        self.url = url or service_url(home)
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def _check(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            if isinstance(detail, dict):
                detail = detail.get("message", detail)
            raise click.ClickException(f"{detail} (HTTP {response.status_code})")
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        try:
            return self._check(self.http.get(path, params=params))
        except httpx.TransportError as exc:
            raise click.ClickException(f"cannot reach the service at {self.url}: {exc}") from exc

    def post(self, path: str, **kwargs: Any) -> Any:
        try:
            return self._check(self.http.post(path, **kwargs))
        except httpx.TransportError as exc:
            raise click.ClickException(f"cannot reach the service at {self.url}: {exc}") from exc

    def submit_yaml(self, text: str, workdir: Path) -> dict[str, Any]:
        return self.post(
            "/api/jobs",
            content=text.encode(),
            headers={"content-type": "application/yaml"},
            params={"workdir": str(workdir)},
        )
