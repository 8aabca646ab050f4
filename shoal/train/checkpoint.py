"""One checkpoint file per job holding every registered object's state.

Data-parallel replicas hold identical model and optimizer state, so rank 0 writes the file
(``state.pt``, written to a temporary name and renamed, so a crash never leaves half a file) and
every rank reads it on restart, whatever the new world size.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol

import torch

FILE_NAME = "state.pt"
FORMAT_VERSION = 1


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class CheckpointStore:
    def __init__(self, directory: Path | None, rank: int) -> None:
        self.directory = directory
        self.rank = rank
        self._objects: dict[str, Stateful] = {}
        self.saved: dict[str, Any] | None = None
        self.meta: dict[str, Any] = {}
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / FILE_NAME
            if path.exists():
                blob = torch.load(path, map_location="cpu", weights_only=False)
                if blob.get("version") != FORMAT_VERSION:
                    raise RuntimeError(
                        f"{path} has checkpoint format {blob.get('version')}, expected "
                        f"{FORMAT_VERSION}; delete it or point SHOAL_CHECKPOINT_DIR elsewhere"
                    )
                self.saved = blob["objects"]
                self.meta = blob["meta"]

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    @property
    def path(self) -> Path | None:
        return None if self.directory is None else self.directory / FILE_NAME

    def register(self, name: str, obj: Stateful) -> bool:
        """Track ``obj``; restore it now if the checkpoint holds it. True when restored."""
        if name in self._objects and self._objects[name] is not obj:
            raise ValueError(f"a different object is already registered as {name!r}")
        self._objects[name] = obj
        if self.saved is not None and name in self.saved:
            obj.load_state_dict(self.saved[name])
            return True
        return False

    def save(self, meta: dict[str, Any]) -> None:
        """Write the checkpoint (rank 0 only; other ranks return at once)."""
        if self.directory is None or self.rank != 0:
            return
        blob = {
            "version": FORMAT_VERSION,
            "meta": {**meta, "time": time.time()},
            "objects": {name: obj.state_dict() for name, obj in self._objects.items()},
        }
        path = self.directory / FILE_NAME
        tmp = path.with_suffix(".tmp")
        torch.save(blob, tmp)
        os.replace(tmp, path)
        self.meta = blob["meta"]
