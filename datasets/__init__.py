"""Benchmark data sets of Neural Laplace Lab (paper Section 5 and Appendix C).

Simulation (delay systems by a batched RK4 method of steps, stiff Van der Pol by RODAS4 in
element-wise arithmetic, closed forms elsewhere), seeded splits with train-only (or, as the
paper's code, all-trajectory) normalisation, Gaussian observation noise, an on-disk cache and
trajectory plots; and the KSG estimators of (conditional) mutual information between
trajectories that the CMI study scores forecasts with.  Arrays are float64 numpy throughout.
"""

from datasets._cache import CacheError, data_home, load_or_simulate, require_writable_home
from datasets._cmi import (
    conditional_mutual_information,
    gaussian_cmi,
    gaussian_mi,
    mutual_information,
)
from datasets._dde import solve_constant_history_dde
from datasets._declared import (
    DataFileError,
    declare_file,
    declare_simulator,
    file_digest,
    simulator_fingerprint,
)
from datasets._declared import check_name as check_system_name
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
    "DataFileError",
    "Dataset",
    "Normaliser",
    "Prepared",
    "SplitData",
    "SystemInfo",
    "check_memory",
    "check_system_name",
    "conditional_mutual_information",
    "data_home",
    "declare_file",
    "declare_simulator",
    "file_digest",
    "gaussian_cmi",
    "gaussian_mi",
    "load_or_simulate",
    "mutual_information",
    "plot_trajectories",
    "prepare",
    "require_writable_home",
    "simulate",
    "simulator_fingerprint",
    "solve_constant_history_dde",
    "solve_vdp",
    "split_sizes",
]
