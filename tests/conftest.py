"""Shared fixtures: the measured data beside the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
POLLUX = DATA / "pollux"


@pytest.fixture(scope="session")
def pollux_data() -> Path:
    if not POLLUX.is_dir():
        pytest.fail(f"shared data missing at {POLLUX}")
    return POLLUX


@pytest.fixture(scope="session")
def profiles(pollux_data):
    from shoal.backends.sim.profile import ProfileLibrary

    return ProfileLibrary(pollux_data / "traces")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs ``--dist loadgroup``), each test file runs on one
    worker, in order, since the tests of a file share module-scoped services and some build on
    what an earlier test submitted; every Ray test runs on one worker, so the session's
    loopback Ray cluster starts once."""
    root = Path(__file__).resolve().parent
    for item in items:
        path = item.path.resolve()
        group = "ray" if root / "ray" in path.parents else str(path)
        item.add_marker(pytest.mark.xdist_group(group))
