"""Benchmark data sets of Neural Laplace Lab (paper Section 5 and Appendix C).

Simulation (delay systems by a batched RK4 method of steps, stiff Van der Pol by LSODA, closed
forms elsewhere), seeded splits with train-only (or, as the paper's code, all-trajectory)
normalisation, Gaussian observation noise, an on-disk cache and trajectory plots.  Arrays are
float64 numpy throughout.

Names load on first use (PEP 562): the home folder's check needs no numpy, the systems' table
no matplotlib, and a command pays only for what it asks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets._cache import load_or_simulate
    from datasets._dde import solve_constant_history_dde
    from datasets._home import CacheError, data_home, require_writable_home
    from datasets._plot import plot_trajectories
    from datasets._prepare import (
        NORMALISE_ON,
        Normaliser,
        Prepared,
        SplitData,
        prepare,
        split_sizes,
    )
    from datasets._simulate import DATA_VERSION, Dataset, check_memory, simulate
    from datasets._systems import PROPERTIES, SYSTEMS, SystemInfo

_LAZY = {
    "CacheError": "_home",
    "data_home": "_home",
    "require_writable_home": "_home",
    "load_or_simulate": "_cache",
    "solve_constant_history_dde": "_dde",
    "plot_trajectories": "_plot",
    "NORMALISE_ON": "_prepare",
    "Normaliser": "_prepare",
    "Prepared": "_prepare",
    "SplitData": "_prepare",
    "prepare": "_prepare",
    "split_sizes": "_prepare",
    "DATA_VERSION": "_simulate",
    "Dataset": "_simulate",
    "check_memory": "_simulate",
    "simulate": "_simulate",
    "PROPERTIES": "_systems",
    "SYSTEMS": "_systems",
    "SystemInfo": "_systems",
}

__all__ = [
    "DATA_VERSION",
    "NORMALISE_ON",
    "PROPERTIES",
    "SYSTEMS",
    "CacheError",
    "Dataset",
    "Normaliser",
    "Prepared",
    "SplitData",
    "SystemInfo",
    "check_memory",
    "data_home",
    "load_or_simulate",
    "plot_trajectories",
    "prepare",
    "require_writable_home",
    "simulate",
    "solve_constant_history_dde",
    "split_sizes",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
