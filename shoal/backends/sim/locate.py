"""Where the simulator finds its measured profiles and workloads by default."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.spec.errors import SpecError

_REPO_ROOT = Path(__file__).resolve().parents[3]


def shared_data_dir() -> Path:
    """``$SHOAL_DATA`` or the ``shared/data`` folder beside the project checkout."""
    env = os.environ.get("SHOAL_DATA")
    return Path(env) if env else _REPO_ROOT.parent / "shared" / "data"


def profile_dirs() -> list[Path]:
    """The profile directories at hand: the shared T4 traces, then the project's own sets."""
    shared = shared_data_dir() / "pollux" / "traces"
    own = sorted(p for p in (_REPO_ROOT / "data").glob("profiles-*") if p.is_dir())
    return ([shared] if shared.is_dir() else []) + own


def default_profiles() -> Path:
    env = os.environ.get("SHOAL_PROFILES")
    path = Path(env) if env else shared_data_dir() / "pollux" / "traces"
    if not path.is_dir():
        raise SpecError(
            f"no profile directory at {path}; pass --profiles DIR or set SHOAL_PROFILES",
            field="profiles",
        )
    return path
