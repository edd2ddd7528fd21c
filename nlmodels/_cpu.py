"""The CPU numerics mode asked for and whether this CPU can run the portable one (stdlib only:
the native kernels' build reads it too; :mod:`nlmodels._numerics` sets the mode up)."""

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
    "MODES",
    "MODE_VARIABLE",
    "PORTABLE_MARCH",
    "cpu_features",
    "cpu_mode",
    "portable",
    "portable_cpu",
]


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
