"""The Ray backend: shoal's jobs as placement groups and actors on a Ray cluster.

See docs/ray.md. Names are imported lazily so that importing the package does not import Ray.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RayBackend", "RaySettings"]


def __getattr__(name: str) -> Any:
    if name == "RayBackend":
        from shoal.backends.ray.backend import RayBackend

        return RayBackend
    if name == "RaySettings":
        from shoal.backends.ray.job import RaySettings

        return RaySettings
    raise AttributeError(name)
