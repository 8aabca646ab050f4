"""The backend's request to checkpoint and exit: SIGTERM, or a ``.resize`` file."""

from __future__ import annotations

import signal
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
