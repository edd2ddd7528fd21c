"""The process-wide numerics settings, set up explicitly by :func:`set_up_numerics`.

**CPU numerics mode** (``NLLAB_CPU_NUMERICS``): the same arithmetic runs different code on
different x86-64 CPUs, and the code paths round differently, so a run's bytes would depend on the
CPU: torch dispatches its CPU kernels by instruction set (``ATEN_CPU_CAPABILITY``: default, avx2,
avx512; PyTorch, ``aten/src/ATen/native/DispatchStub.cpp``), MKL picks its matrix-product kernels
by CPU vendor and model, oneDNN its ISA (``ONEDNN_MAX_CPU_ISA``), the native kernels are compiled
for the CPU at hand, and scipy's/numpy's OpenBLAS picks kernels per CPU (``threadpoolctl`` names
them).

* ``portable`` (default): every x86-64 CPU with AVX2 and FMA runs the same arithmetic: torch's
  AVX2 kernels, oneDNN capped at AVX2, the native kernels built for ``x86-64-v3`` without FMA
  contraction (:mod:`nlmodels.accel.native._store`), and every CPU matrix product and
  elementary function (exp, tanh, sin ...) through the platform's own kernels
  (:mod:`nlmodels.accel.portable`: MKL, which torch calls for them, cannot be pinned on non-Intel
  CPUs).
  The data sets never call BLAS (:mod:`datasets`). On other CPUs, or without the native
  kernels (no C compiler, no writable cache, a failed self-test), the mode is unavailable and
  the process runs as in ``native``: :func:`numerics_downgrade` is the line that says so, which
  commands print first and cell runs are tagged with; ``nllab doctor`` fails.
* ``native``: each CPU's fastest code (the user's ``ATEN_CPU_CAPABILITY`` and ``MKL_CBWR`` are
  kept; MKL strict mode when unset; kernels for ``-march=native``): the same bytes on one
  machine, not across CPUs.

Nothing happens on import: a library must not change its host process. The platform's entry
points (the command line, worker processes, the test suite) call :func:`set_up_numerics` before
torch computes; Python users call it first too, and the training API refuses in one line when
torch already runs another kernel set (:func:`require_numerics`).

MKL strict mode (Intel, *Developer Reference for oneMKL*, "Obtaining Numerically Reproducible
Results") matters in the native mode: by default MKL's double-precision matrix products round
differently when an operand or the result is not 32-byte aligned, and a packed model's batched
products put member ``j``'s result at offset ``j × out × in``, so a cell's bytes depended on its
position in its pack. :func:`mkl_position_independent` checks that the mode took effect.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from nlmodels._cpu import (
    MODE_VARIABLE,
    MODES,
    PORTABLE_MARCH,
    cpu_features,
    cpu_mode,
    portable,
    portable_cpu,
)

MKL_CBWR = "AUTO,STRICT"
#: What the portable mode sets in the process environment (replacing the user's values; worker
#: processes inherit them).
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}

__all__ = [
    "MKL_CBWR",
    "MODES",
    "MODE_VARIABLE",
    "PORTABLE_ENV",
    "PORTABLE_MARCH",
    "NumericsError",
    "NumericsSetup",
    "cpu_features",
    "cpu_mode",
    "cpu_mode_in_effect",
    "mkl_position_independent",
    "numerics_downgrade",
    "numerics_in_effect",
    "numerics_note",
    "numerics_tag",
    "on_numerics_effect",
    "portable",
    "require_numerics",
    "set_up_numerics",
]

_CHECKED: list[bool] = []
_lock = threading.Lock()
_asked: tuple[str, tuple[str, ...]] | None = None  # the mode and what it replaced
_setup: NumericsSetup | None = None
_on_effect: Callable[[NumericsSetup], None] | None = None  # told once, when they take effect


class NumericsError(RuntimeError):
    """The numerics asked for cannot take effect in this process (torch already computed with
    another kernel set)."""


@dataclass(frozen=True)
class NumericsSetup:
    """What :func:`set_up_numerics` did.

    Attributes:
        asked: the mode asked for (``portable`` or ``native``).
        mode: the mode in effect.
        capability: torch's CPU kernel set (``AVX2``, ``AVX512``, ``DEFAULT``).
        kernels: who computes CPU matrix products and elementary functions: ``portable`` (the
            platform's kernels, :mod:`nlmodels.accel.portable`) or ``torch`` (MKL through torch).
        replaced: the user's environment values the mode replaced (``NAME=value``).
        reason: why the mode in effect is not the one asked for (empty when it is).
        fix: what gives the mode asked for (with ``reason``).
    """

    asked: str
    mode: str
    capability: str
    kernels: str
    replaced: tuple[str, ...] = ()
    reason: str = ""
    fix: str = ""

    @property
    def label(self) -> str:
        """The mode with torch's kernel set, as runs are tagged: ``portable (AVX2)``."""
        return f"{self.mode} ({self.capability})"


def _apply_environment(mode: str) -> tuple[str, ...]:
    os.environ[MODE_VARIABLE] = mode
    if mode != "portable" or not portable_cpu():
        os.environ.setdefault("MKL_CBWR", MKL_CBWR)
        return ()
    replaced = tuple(
        f"{k}={os.environ[k]}" for k, v in PORTABLE_ENV.items() if os.environ.get(k, v) != v
    )
    os.environ.update(PORTABLE_ENV)
    return replaced


def set_up_numerics(mode: str | None = None, *, defer: bool = False) -> NumericsSetup | None:
    """Set this process's numerics (``mode``, else ``$NLLAB_CPU_NUMERICS``, else portable)
    before torch computes: the environment of the mode (inherited by worker processes) and, in
    the portable mode, the platform's matrix products. Idempotent; the first call decides.

    ``defer``: set the environment only (no torch import: the command line does this first, so
    that usage errors stay fast) and leave the rest to :func:`require_numerics`, which the
    training paths call; returns None then.

    Raises ValueError for an unknown mode, and :class:`NumericsError` when the portable mode is
    asked for but torch already runs another kernel set (it computed before this call)."""
    global _asked
    asked = (mode or "").strip().lower() or cpu_mode()
    if asked not in MODES:
        raise ValueError(f"{MODE_VARIABLE} must be one of {', '.join(MODES)}; got {asked!r}")
    with _lock:
        if _asked is not None and _asked[0] != asked:
            raise NumericsError(
                f"the CPU numerics of this process are already set up ({_asked[0]}); "
                f"{asked} takes a new process"
            )
        if _asked is None:
            _asked = (asked, _apply_environment(asked))
    return None if defer else require_numerics()


def require_numerics() -> NumericsSetup:
    """The numerics in effect, completing their set-up now (the training paths call this
    first: a process that never called :func:`set_up_numerics` gets the default mode, or one
    line saying why it cannot take effect)."""
    global _setup
    if _setup is not None:
        return _setup
    if _asked is None:
        set_up_numerics(defer=True)
    with _lock:
        if _setup is None:
            assert _asked is not None
            _setup = _take_effect(*_asked)
            if _on_effect is not None:
                _on_effect(_setup)
        return _setup


def on_numerics_effect(told: Callable[[NumericsSetup], None]) -> None:
    """Have ``told(setup)`` called once, when this process's numerics take effect
    (:func:`require_numerics`: the first computation that needs them), or now if they have: a
    command says what they are when its work starts, not before its usage errors. Worker
    processes do not inherit it."""
    global _on_effect
    with _lock:
        setup, _on_effect = _setup, told
    if setup is not None:
        told(setup)


def _take_effect(asked: str, replaced: tuple[str, ...]) -> NumericsSetup:
    import torch

    from nlmodels.accel import native
    from nlmodels.accel import portable as portable_kernels

    capability = torch.backends.cpu.get_cpu_capability()  # fixed by torch's first kernel call
    if asked != "portable":
        return NumericsSetup(asked, "native", capability, "torch", replaced)
    if not portable_cpu():
        reason = "this CPU lacks AVX2 or FMA"
        fix = f"none on this CPU ({MODE_VARIABLE}=native says so)"
        return NumericsSetup(asked, "native", capability, "torch", replaced, reason, fix)
    if capability.lower() != PORTABLE_ENV["ATEN_CPU_CAPABILITY"]:
        raise NumericsError(
            f"torch already computes with its {capability} kernels in this process (it ran before "
            "the CPU numerics were set up): call nlmodels.set_up_numerics() first, before any "
            f"torch computation, or set {MODE_VARIABLE}=native"
        )
    if not portable_kernels.install():
        failure = native.build_failure() or "?"
        reason = f"no native kernels for the portable mode ({failure})"
        return NumericsSetup(asked, "native", capability, "torch", replaced, reason, _fix(failure))
    return NumericsSetup(asked, "portable", capability, "portable", replaced)


def _fix(failure: str) -> str:
    """What makes the native kernels build, load and pass their self-test, by ``failure``."""
    if "no C compiler" in failure:
        return "install a C compiler (gcc or clang; CC names another one) and run again"
    if "self-test" in failure:
        return (
            "`nllab doctor` names the failing check; "
            f"{MODE_VARIABLE}=native accepts this CPU's own bytes"
        )
    return (
        "point NLLAB_NATIVE_CACHE to a folder only you can write (chmod 700) with room for "
        "the kernels, and run again"
    )


def numerics_downgrade() -> str:
    """One line when the numerics in effect are not the ones asked for (empty when they are,
    or before they take effect): which, why, what it means for the bytes and how to get the
    mode asked for. Entry points print it, the library never does."""
    setup = _setup
    if setup is None or setup.mode == setup.asked:
        return ""
    return (
        f"the CPU numerics are {setup.label}, not the {setup.asked} ones asked for: "
        f"{setup.reason}. This run's bytes are this CPU's own: they will not match the pinned "
        f"ones nor a {setup.asked} run's on any machine. Fix: {setup.fix}"
    )


def numerics_note() -> str:
    """One line saying which of the user's environment values the portable mode replaced (empty
    when none): entry points print it, the library never does."""
    replaced = _asked[1] if _asked is not None else ()
    if not replaced:
        return ""
    return (
        f"portable CPU numerics replace {', '.join(replaced)} ({MODE_VARIABLE}=native keeps them)"
    )


def numerics_in_effect() -> NumericsSetup | None:
    """What :func:`set_up_numerics` did in this process (None: not called yet)."""
    return _setup


def mkl_position_independent() -> bool:
    """Whether a batched product gives a member the same bytes at an unaligned offset as at an
    aligned one (False: MKL started before its strict mode was set, e.g. after a matrix
    product in the importing program; always True with the portable kernels)."""
    if not _CHECKED:
        import torch

        g = torch.Generator().manual_seed(0)
        a = torch.randn(1, 31, 32, generator=g, dtype=torch.float64).expand(2, -1, -1)
        b = torch.randn(1, 32, 31, generator=g, dtype=torch.float64).expand(2, -1, -1)
        out = torch.bmm(a.contiguous(), b.contiguous())
        _CHECKED.append(bool(torch.equal(out[0], out[1])))
    return _CHECKED[0]


def cpu_mode_in_effect() -> str:
    """``portable`` when this process runs the portable mode (set up, the pinned kernel set and
    the platform's kernels in effect), else ``native``; with torch's kernel set, e.g.
    ``portable (AVX2)``."""
    if _setup is not None:
        return _setup.label
    import torch

    return f"native ({torch.backends.cpu.get_cpu_capability()})"


def numerics_tag() -> str:
    """What a run records of the process's numerics: the CPU mode in effect
    (:func:`cpu_mode_in_effect`), whose kernels compute products and elementary functions, the
    MKL mode asked for, whether
    members' bytes are independent of their position in a pack, and torch's intra-op threads
    (parallel reductions split by thread: a cell's bytes depend on the count, which runs pin)."""
    import torch

    mode = os.environ.get("MKL_CBWR", "") or "default"
    kernels = _setup.kernels if _setup is not None else "torch"
    return (
        f"cpu={cpu_mode_in_effect()}; kernels={kernels}; mkl_cbwr={mode}; "
        f"position_independent={mkl_position_independent()}; "
        f"torch_threads={torch.get_num_threads()}"
    )
