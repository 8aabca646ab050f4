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
            "cpu": _cpu_model(), **packages, "numpy_simd": _numpy_simd(), "blas": _blas()}


def _numpy_simd() -> str:
    """The SIMD targets numpy dispatches to on this CPU: the same build picks other kernels on
    CPUs with other vector units (AVX2 against AVX-512, say)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # a numpy without these (private) tables
        return "unknown"
    return " ".join(name for name in __cpu_dispatch__ if __cpu_features__.get(name)) or "none"


def _blas() -> str:
    """Each BLAS that numpy and scipy loaded, with the kernel set it chose for this CPU."""
    import numpy  # noqa: F401  (loads numpy's BLAS)
    import scipy.linalg  # noqa: F401  (and scipy's)
    from threadpoolctl import threadpool_info

    found = sorted({f"{info.get('internal_api')} {info.get('version')} "
                    f"{info.get('architecture', '')}".strip()
                    for info in threadpool_info() if info.get("user_api") == "blas"})
    return ", ".join(found) or "none"


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
