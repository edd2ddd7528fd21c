"""Benchmark data sets of Neural Laplace Lab (paper Section 5 and Appendix C).

Simulation (delay systems by a batched RK4 method of steps, stiff Van der Pol by RODAS4 in
element-wise arithmetic, closed forms elsewhere), seeded splits with train-only (or, as the
paper's code, all-trajectory) normalisation, Gaussian observation noise, an on-disk cache and
trajectory plots; and the KSG estimators of (conditional) mutual information between
trajectories that the CMI study scores forecasts with.  Arrays are float64 numpy throughout.

Names load on first use (PEP 562): the home folder's check needs no numpy, the systems' table
no matplotlib, and a command pays only for what it asks.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The private module that defines each public name.
_WHERE = {
    name: module
    for module, names in {
        "_home": "CacheError cache_folders create_home data_home installation_cache "
        "require_writable_home",
        "_cache": "load_or_simulate",
        "_dde": "solve_constant_history_dde",
        "_declared": "DataFileError declare_file declare_simulator file_digest "
        "simulator_fingerprint",
        "_plot": "plot_trajectories",
        "_prepare": "NORMALISE_ON Normaliser Prepared SplitData check_split prepare split_sizes",
        "_simulate": "DATA_VERSION Dataset check_memory simulate",
        "_stiff": "solve_vdp",
        "_systems": "PROPERTIES SYSTEMS SystemInfo",
    }.items()
    for name in names.split()
}
#: Public names under another name in their module.
_ALIASES = {"check_system_name": "check_name"}
_WHERE["check_system_name"] = "_declared"

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), _ALIASES.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
