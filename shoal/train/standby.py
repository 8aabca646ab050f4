"""Pre-warmed starts: a replica that is ready to train before the job it replaces has stopped.

When a running job is resized, the backend starts the new replicas with
``SHOAL_STANDBY_FILE=<go file>`` while the old ones keep training. ``init()`` then finishes
what is slow in a fresh process (the script's imports before ``init()``, torch's lazily
imported parts), announces itself with ``<go file>.rank<R>.ready`` and waits. The backend stops
the old replicas once every new one is ready, and creates the go file after they have
checkpointed; only then do the new replicas join the process group and load the checkpoint.
So a resize costs the job one checkpoint and a rendezvous, not a cold start.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import time
from pathlib import Path

from shoal.train.signals import ResizeSignal

log = logging.getLogger("shoal.train")

# Imported lazily by torch on first use in every training process: the optimizer constructors
# (``torch._dynamo``, several seconds on a small machine).
_WARM_MODULES = ("torch._dynamo",)
_POLL_S = 0.01


def ready_file(go_file: Path, rank: int) -> Path:
    return go_file.with_name(f"{go_file.name}.rank{rank}.ready")


def await_go(
    go_file: Path, rank: int, resize: ResizeSignal, exit_code: int, timeout_s: float = 900.0
) -> float:
    """Warm up, mark this rank ready and wait for ``go_file``; seconds waited.

    A SIGTERM meanwhile (the backend gave up on this start) or no go file within ``timeout_s``
    ends the process with ``exit_code``: it has trained nothing, so nothing is lost.
    """
    for module in _WARM_MODULES:
        with contextlib.suppress(ImportError):  # a torch build without it
            importlib.import_module(module)
    marker = ready_file(go_file, rank)
    marker.write_text(str(os.getpid()))
    started = time.monotonic()
    while not go_file.exists():
        if resize.signalled:
            sys.exit(exit_code)
        if time.monotonic() - started > timeout_s:
            log.warning("shoal: no go signal within %.0f s of standby; exiting", timeout_s)
            sys.exit(exit_code)
        time.sleep(_POLL_S)
    return time.monotonic() - started
