"""Import a script of bench/ as a module, the way running it from bench/ would."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str) -> ModuleType:
    """``bench/<name>.py`` as the module ``name``. bench/ is on the path while it loads (the
    scripts import their siblings), and the module is registered in ``sys.modules`` (dataclasses
    look their module up while being defined)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module
