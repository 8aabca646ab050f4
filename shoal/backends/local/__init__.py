"""The local backend: real training processes on this machine's GPUs or CPU slots."""

from shoal.backends.local.backend import LocalBackend
from shoal.backends.local.devices import DevicePool, detect_pool

__all__ = ["DevicePool", "LocalBackend", "detect_pool"]
