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


# The float64 ufuncs whose kernels describe() names: those model fits and solvers lean on.
_KERNEL_UFUNCS = ("add", "multiply", "divide", "exp", "log", "sqrt", "power")


def _numpy_simd() -> str:
    """The SIMD kernel numpy runs for the float64 ufuncs that model fits and solvers lean on,
    e.g. ``exp:X86_V4`` (AVX-512): the same build picks other kernels on CPUs with other vector
    units, and their results can differ in the last bits. "unknown" for a numpy without
    ``numpy.lib.introspect`` (added in 2.0)."""
    try:
        from numpy.lib.introspect import opt_func_info
    except ImportError:
        return "unknown"
    info = opt_func_info(func_name=f"^({'|'.join(_KERNEL_UFUNCS)})$", signature="float64")
    kernels = [f"{name}:{loop['current']}" for name in _KERNEL_UFUNCS
               for loop in info.get(name, {}).values()]
    return " ".join(kernels) or "none"


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
