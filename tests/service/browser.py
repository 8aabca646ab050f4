"""Headless Chromium (Playwright driving the system browser) for the dashboard's tests.

Needs ``/usr/bin/chromium`` (Debian: ``apt-get install -y chromium``). Without it a browser
check is skipped, except under ``CI``, where a missing browser is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]
MISSING = f"{CHROMIUM} is missing (apt-get install -y chromium)"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@contextmanager
def chromium() -> Iterator[Any | None]:
    """A launched browser, or None where there is none and this is not CI."""
    if not CHROMIUM.exists():
        if in_ci():
            pytest.fail(MISSING)
        yield None
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
