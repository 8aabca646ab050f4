"""bench/environment.py: what a benchmark ran on, down to the kernels numpy and BLAS chose."""

import numpy
from threadpoolctl import threadpool_info

from tests.sim.bench_scripts import load


def test_the_environment_names_numpys_kernels_and_each_loaded_blas():
    environment = load("environment").describe()
    assert set(environment) >= {"python", "cpu", "numpy", "scipy", "numpy_simd", "blas"}
    assert all(isinstance(value, str) and value for value in environment.values())
    loaded = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    assert loaded, "describe() loads numpy's and scipy's BLAS"
    for info in loaded:
        assert info["internal_api"] in environment["blas"]
        assert info.get("architecture", "") in environment["blas"]
    if hasattr(numpy.lib, "introspect"):
        for name in ("exp", "log", "add"):
            assert f"{name}:" in environment["numpy_simd"]
    else:
        assert environment["numpy_simd"] == "unknown"
