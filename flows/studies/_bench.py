"""Import the repository's benchmark scripts (``benchmarks/*.py``) as modules, so studies reuse
their measuring functions (ILT table, epoch seconds, NFE) instead of copying them."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

__all__ = ["benchmark_module"]

_ROOT = Path(__file__).resolve().parents[2]


@cache
def benchmark_module(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (``ilt_table`` or ``models``)."""
    path = _ROOT / "benchmarks" / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"benchmark script {str(path)!r} not found: studies need the source checkout"
        )
    spec = importlib.util.spec_from_file_location(f"nllab_benchmarks_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
