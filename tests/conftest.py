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
