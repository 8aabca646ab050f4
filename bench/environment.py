"""What a benchmark ran on: simulated results depend on it (see docs/scheduling.md).

The simulator is deterministic on one machine, but model fits and MILP tie-breaks follow the
floating-point behaviour of the CPU and of the numpy/scipy builds, and one changed decision
changes the rest of a run. Benchmarks record this next to their results.
"""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path


def describe() -> dict[str, str]:
    packages = {name: _version(name) for name in ("numpy", "scipy", "torch")}
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpu": _cpu_model(), **packages}


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"
