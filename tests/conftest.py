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


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/ray/ is marked ``ray``. ``make test`` runs the other test files
    on two processes (``--dist loadfile``: a file's tests share module-scoped services, and
    some build on what an earlier test submitted, so each file stays on one process), then the
    Ray tests and the ``realtime`` ones one at a time, so the session's loopback Ray cluster
    starts once. (xdist's ``loadgroup`` would keep them together, but with pytest 9.2 it does
    not group: it renames ``item._nodeid``, which pytest no longer reads.)"""
    ray_tests = Path(__file__).resolve().parent / "ray"
    for item in items:
        if ray_tests in item.path.resolve().parents:
            item.add_marker(pytest.mark.ray)
