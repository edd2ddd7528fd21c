"""Benchmark data sets of Neural Laplace Lab (paper Section 5 and Appendix C).

Simulation (delay systems by a batched RK4 method of steps, stiff Van der Pol by RODAS4 in
element-wise arithmetic, closed forms elsewhere), seeded splits with train-only (or, as the
paper's code, all-trajectory) normalisation, Gaussian observation noise, an on-disk cache and
trajectory plots.  Arrays are float64 numpy throughout.
"""

from datasets._cache import CacheError, data_home, load_or_simulate
from datasets._dde import solve_constant_history_dde
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
from datasets._stiff import solve_vdp
from datasets._systems import PROPERTIES, SYSTEMS, SystemInfo

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
    "simulate",
    "solve_constant_history_dde",
    "solve_vdp",
    "split_sizes",
]
