"""The local backend: real training processes on this machine's GPUs or CPU slots.

Names are imported lazily so that the per-replica shim (``shoal.backends.local.shim``) starts
without numpy, scipy or torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DevicePool", "LocalBackend", "detect_pool"]


def __getattr__(name: str) -> Any:
    if name == "LocalBackend":
        from shoal.backends.local.backend import LocalBackend

        return LocalBackend
    if name in ("DevicePool", "detect_pool"):
        from shoal.backends.local import devices

        return getattr(devices, name)
    raise AttributeError(name)
