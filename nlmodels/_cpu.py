"""The CPU numerics mode asked for and whether this CPU can run the portable one (stdlib only:
the native kernels' build reads it too; :mod:`nlmodels.numerics` sets the mode up)."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

MODE_VARIABLE = "NLLAB_CPU_NUMERICS"
MODES = ("portable", "native")
#: The native kernels' target in the portable mode (AVX2, FMA, BMI2: Haswell, Zen and newer).
PORTABLE_MARCH = "x86-64-v3"

__all__ = [
    "BYTE_MOVING_ENVIRONMENT",
    "MODES",
    "MODE_VARIABLE",
    "PORTABLE_MARCH",
    "cpu_features",
    "cpu_mode",
    "numerics_environment",
    "portable",
    "portable_cpu",
]


#: Families (prefixes) of environment variables through which this package or a library it
#: loads can change the bytes a float64 computation gives: the BLAS, LAPACK and OpenMP runtimes
#: (MKL, OpenBLAS, oneDNN, GNU and Intel OpenMP), torch's and numpy's CPU dispatch, the dynamic
#: linker, and this package's numerics switches (the mode; the native kernels' use and target).
BYTE_MOVING_ENVIRONMENT = (
    "ATEN_",
    "DNNL_",
    "GOMP_",
    "KMP_",
    "LD_",
    "MKL_",
    "NPY_",
    "OMP_",
    "ONEDNN_",
    "OPENBLAS_",
    MODE_VARIABLE,
    "NLLAB_NATIVE",
)
#: Of those families, the variables that only name a place (where a build is cached).
_PLACES = frozenset({"NLLAB_NATIVE_CACHE"})


def numerics_environment() -> str:
    """What besides the code decides the bytes this machine computes: the CPU's feature flags,
    the C library, and every environment variable of the :data:`BYTE_MOVING_ENVIRONMENT`
    families (a cache key's part: a variable that moves nothing costs a recomputation, a missing
    one a wrong reuse)."""
    env = sorted(
        f"{k}={v}"
        for k, v in os.environ.items()
        if k.startswith(BYTE_MOVING_ENVIRONMENT) and k not in _PLACES
    )
    return "\n".join([cpu_features(), " ".join(platform.libc_ver()), *env])


def cpu_features() -> str:
    """This CPU's feature flags (``/proc/cpuinfo``'s flags line, else the processor name)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def cpu_mode() -> str:
    """The mode asked for (``NLLAB_CPU_NUMERICS``, default ``portable``); ValueError if unknown."""
    mode = os.environ.get(MODE_VARIABLE, "").strip().lower() or "portable"
    if mode not in MODES:
        raise ValueError(f"{MODE_VARIABLE} must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


@functools.cache  # a process's CPU does not change: /proc/cpuinfo read once, not per cell
def portable_cpu() -> bool:
    """Whether this CPU can run the portable mode (x86-64 with AVX2 and FMA)."""
    flags = set(cpu_features().split())
    return platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "fma"} <= flags


def portable() -> bool:
    """Whether this process asks for the portable mode on a CPU that can run it (AVX2 and FMA);
    the native kernels' build target follows it."""
    try:
        return cpu_mode() == "portable" and portable_cpu()
    except ValueError:
        return False
