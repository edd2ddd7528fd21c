"""The process-wide numerics settings the platform fixes before torch computes anything.

**CPU numerics mode** (``NLLAB_CPU_NUMERICS``): the same arithmetic runs different code on
different x86-64 CPUs, and the code paths round differently, so a run's bytes depend on the CPU:
torch dispatches its CPU kernels by instruction set (``ATEN_CPU_CAPABILITY``: default, avx2,
avx512; PyTorch, ``aten/src/ATen/native/DispatchStub.cpp``), MKL picks a BLAS branch per CPU
(``MKL_CBWR``), oneDNN its ISA (``ONEDNN_MAX_CPU_ISA``) and the native kernels are compiled for
the CPU at hand.

* ``portable`` (default): every x86-64 CPU with AVX2 and FMA runs the same code: torch's AVX2
  kernels, MKL's AVX2 branch in strict mode, oneDNN capped at AVX2 and the native kernels built
  for ``x86-64-v3`` without FMA contraction (:mod:`nlmodels.accel.native._store`). These are set
  when this package is imported, before torch's first kernel call reads them; a value the user
  had set is replaced, with one line on stderr saying so. On other CPUs the mode is unavailable
  and the process runs as in ``native`` (the ``numerics`` tag says which).
* ``native``: each CPU's fastest code (the user's ``ATEN_CPU_CAPABILITY`` and ``MKL_CBWR`` are
  kept; MKL strict mode when unset; kernels for ``-march=native``): the same bytes on one
  machine, not across CPUs.

MKL strict mode (Intel, *Developer Reference for oneMKL*, "Obtaining Numerically Reproducible
Results") matters in both modes: by default MKL's double-precision matrix products round
differently when an operand or the result is not 32-byte aligned, and a packed model's batched
products put member ``j``'s result at offset ``j × out × in``, so a cell's bytes depended on its
position in its pack. :func:`mkl_position_independent` checks that the mode took effect.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from pathlib import Path

MODE_VARIABLE = "NLLAB_CPU_NUMERICS"
MODES = ("portable", "native")
MKL_CBWR = "AUTO,STRICT"
#: What the portable mode sets (replacing the user's values).
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
#: The native kernels' target in the portable mode (AVX2, FMA, BMI2: Haswell, Zen and newer).
PORTABLE_MARCH = "x86-64-v3"

__all__ = [
    "MKL_CBWR",
    "MODES",
    "MODE_VARIABLE",
    "PORTABLE_ENV",
    "PORTABLE_MARCH",
    "cpu_features",
    "cpu_mode",
    "cpu_mode_in_effect",
    "mkl_position_independent",
    "numerics_tag",
    "portable",
]

_CHECKED: list[bool] = []


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
def _portable_cpu() -> bool:
    flags = set(cpu_features().split())
    return platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "fma"} <= flags


def portable() -> bool:
    """Whether this process runs the portable mode (asked for, and this CPU has AVX2 and FMA)."""
    return cpu_mode() == "portable" and _portable_cpu()


def _apply() -> None:
    try:
        cpu_mode()
    except ValueError as e:
        print(f"nllab: {e}; using portable", file=sys.stderr)
        os.environ[MODE_VARIABLE] = "portable"
    if not portable():
        os.environ.setdefault("MKL_CBWR", MKL_CBWR)
        return
    replaced = [
        f"{k}={os.environ[k]}" for k, v in PORTABLE_ENV.items() if os.environ.get(k, v) != v
    ]
    os.environ.update(PORTABLE_ENV)
    if replaced:
        # Workers inherit the pinned values, so only the first process says it.
        print(
            f"nllab: portable CPU numerics replace {', '.join(replaced)} "
            f"({MODE_VARIABLE}=native keeps them)",
            file=sys.stderr,
        )


_apply()


def mkl_position_independent() -> bool:
    """Whether a batched product gives a member the same bytes at an unaligned offset as at an
    aligned one (False: MKL started before this package set its mode, e.g. after a matrix
    product in the importing program)."""
    if not _CHECKED:
        import torch

        g = torch.Generator().manual_seed(0)
        a = torch.randn(1, 31, 32, generator=g, dtype=torch.float64).expand(2, -1, -1)
        b = torch.randn(1, 32, 31, generator=g, dtype=torch.float64).expand(2, -1, -1)
        out = torch.bmm(a.contiguous(), b.contiguous())
        _CHECKED.append(bool(torch.equal(out[0], out[1])))
    return _CHECKED[0]


def cpu_mode_in_effect() -> str:
    """``portable`` when this process runs the portable mode and torch really runs the pinned
    kernel set (a program that computed with torch before importing this package keeps its
    CPU's), else ``native``; with torch's kernel set, e.g. ``portable (AVX2)``."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    pinned = portable() and capability.lower() == PORTABLE_ENV["ATEN_CPU_CAPABILITY"]
    return f"{'portable' if pinned else 'native'} ({capability})"


def numerics_tag() -> str:
    """What a run records of the process's numerics: the CPU mode in effect
    (:func:`cpu_mode_in_effect`), the MKL mode asked for, whether members' bytes are independent
    of their position in a pack, and torch's intra-op threads (parallel reductions split by
    thread: a cell's bytes depend on the count, which runs pin)."""
    import torch

    mode = os.environ.get("MKL_CBWR", "") or "default"
    return (
        f"cpu={cpu_mode_in_effect()}; mkl_cbwr={mode}; "
        f"position_independent={mkl_position_independent()}; "
        f"torch_threads={torch.get_num_threads()}"
    )
