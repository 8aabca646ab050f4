"""The backend's request to checkpoint and exit (SIGTERM, or a ``.resize`` file), and a quick
exit once it is done."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

RESIZE_FILE = ".resize"


class ResizeSignal:
    """Remembers that a checkpoint-and-exit was requested; acted on at a step boundary."""

    def __init__(self, checkpoint_dir: Path | None) -> None:
        self.file = None if checkpoint_dir is None else checkpoint_dir / RESIZE_FILE
        self._signalled = False
        self._previous: object = None
        # Without a checkpoint directory there is nothing to resume from: keep default SIGTERM.
        if self.file is not None and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = True

    @property
    def signalled(self) -> bool:
        """SIGTERM arrived (the ``.resize`` file is not looked at)."""
        return self._signalled

    def requested(self) -> bool:
        return self._signalled or (self.file is not None and self.file.exists())

    def clear_file(self) -> None:
        """Remove the request file so the restarted job does not exit again at once."""
        if self.file is not None:
            self.file.unlink(missing_ok=True)

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]
            self._previous = None


def end_quickly_at_exit(code: int) -> None:
    """Skip the interpreter's finalization when this process ends (after a checkpoint).

    Tearing down an interpreter with torch loaded takes seconds on a small machine, and a resize
    waits for the old processes to exit. Registered with ``threading``'s shutdown hooks, the
    function runs once the stack has unwound (the script's ``finally`` blocks have run): it
    joins the script's own threads, runs the ``atexit`` callbacks, flushes the standard streams
    and ends the process with ``code``. Only call it right before raising ``SystemExit(code)``.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return

    def finish() -> None:
        current = threading.current_thread()
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon and thread.is_alive():
                thread.join()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    with contextlib.suppress(RuntimeError):  # already shutting down
        register(finish)


_FREEZE_INSTALLED = False


def freeze_heap_at_exit() -> None:
    """Let the interpreter exit in a fraction of a second instead of seconds.

    Finalizing an interpreter with torch loaded spends seconds in garbage-collection passes
    over objects that die with the process anyway; ``gc.freeze()`` at exit takes them out of
    those passes. ``atexit`` callbacks and ``finally`` blocks run as usual. Installed once.
    """
    global _FREEZE_INSTALLED
    if not _FREEZE_INSTALLED:
        atexit.register(gc.freeze)
        _FREEZE_INSTALLED = True
