"""Fused float64 CPU kernels (``kernels.c``), built once per machine and loaded with ctypes.

Why: on the CPU, Neural Laplace's training step is dominated not by FLOPs but by per-operator
overhead: the encoder GRU is ~200 sequential steps of tiny matrix products and gate maths, and
the decoder's output map is a chain of ~15 elementwise passes. These kernels run each of those
as a single vectorised loop (inline polynomial exp, sin and cos), ~1.7x faster end to end.

The kernels are plain C99, no Python or torch headers, so the build takes about a second with
the system C compiler (``$CC``, else ``cc``), at ``-O3 -march=native``. The shared object is
cached under ``$NLLAB_NATIVE_CACHE`` (default ``~/.cache/nllab/native``), keyed by the source,
the flags and this CPU's features, and written atomically, so concurrent processes and machines
sharing a home folder are safe.

``NLLAB_NATIVE`` selects the mode: ``auto`` (default: use the kernels when they build, else warn
once and keep the pure-torch path), ``0`` (never use them) or ``1`` (they must build: raise).
``NLLAB_NATIVE_MARCH`` sets ``-march`` (default ``native``; ``haswell`` gives the AVX2 build).
Every kernel has a pure-torch twin that the tests hold it to.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

__all__ = ["NativeUnavailable", "call", "kernels", "native_enabled", "usable"]

_SOURCE = Path(__file__).with_name("kernels.c")
# 512-bit vectors where the CPU has them (GCC otherwise caps auto-vectorisation at 256 bits)
_FLAGS = ("-O3", "-mprefer-vector-width=512", "-fPIC", "-shared", "-std=gnu11")


def _flags() -> tuple[str, ...]:
    """Compiler flags; ``$NLLAB_NATIVE_MARCH`` (default ``native``) picks the target CPU, e.g.
    ``haswell`` for the AVX2 + FMA build on any newer CPU (the tests run both builds)."""
    return (f"-march={os.environ.get('NLLAB_NATIVE_MARCH') or 'native'}", *_FLAGS)


_MODES = {"auto", "0", "1"}
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failure: str | None = None

_I64, _INT, _DBL, _PTR = ctypes.c_int64, ctypes.c_int, ctypes.c_double, ctypes.c_void_p
_SIGNATURES = {
    "nl_gru_forward": (_INT, [_I64] * 5 + [_PTR] * 7),
    "nl_gru_backward": (_INT, [_I64] * 5 + [_PTR] * 11),
    "nl_first_hidden": (None, [_I64, _I64, _I64, _INT, _PTR, _PTR, _PTR]),
    "nl_first_hidden_backward": (None, [_I64, _I64, _I64, _INT, _PTR, _PTR, _PTR, _PTR]),
    "nl_bias_tanh": (None, [_I64, _I64, _PTR, _PTR]),
    "nl_tanh_backward": (None, [_I64, _I64, _PTR, _PTR, _PTR]),
    "nl_sphere_out_forward": (
        None,
        [_I64, _I64, _I64, _I64, _INT, _PTR, _PTR, _PTR, _PTR, _DBL, _DBL, _PTR, _PTR],
    ),
    "nl_sphere_out_backward": (None, [_I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR]),
    "nl_vector_math": (None, [_INT, _I64, _PTR, _PTR]),
}


class NativeUnavailable(RuntimeError):
    """The native kernels were required (``NLLAB_NATIVE=1``) but could not be built or loaded."""


def _mode() -> str:
    mode = os.environ.get("NLLAB_NATIVE", "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise ValueError(f"NLLAB_NATIVE must be one of auto, 0, 1; got {mode!r}")
    return mode


def _cache_dir() -> Path:
    if os.environ.get("NLLAB_NATIVE_CACHE"):
        return Path(os.environ["NLLAB_NATIVE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nllab" / "native"


def _cpu_features() -> str:
    """This CPU's feature flags (the build uses -march=native, so they are part of the key)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _target() -> Path:
    """Where this source, these flags and this CPU's build lives (no compiler needed to find it:
    plain C has a stable ABI, so a build by any C compiler serves)."""
    parts = (_SOURCE.read_bytes(), " ".join(_flags()), platform.machine(), _cpu_features())
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    key = digest.hexdigest()[:16]
    return _cache_dir() / f"nlkernels-{key}.so"


def _build(target: Path) -> None:
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise OSError(f"no C compiler {compiler!r} on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *_flags(), str(_SOURCE), "-o", tmp],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise OSError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: a concurrent builder never sees half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load() -> ctypes.CDLL:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise OSError(f"no native kernels for {platform.system()} {platform.machine()}")
    target = _target()
    if not target.exists():
        _build(target)
    library = ctypes.CDLL(str(target))
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(library, name)
        function.restype, function.argtypes = restype, argtypes
    return library


def _forget() -> None:
    """Drop the loaded library and any recorded failure (tests: the next use loads afresh)."""
    global _library, _failure
    with _lock:
        _library, _failure = None, None


def kernels() -> ctypes.CDLL | None:
    """The loaded kernel library, or None (disabled, or it could not be built: warned once)."""
    global _library, _failure
    mode = _mode()
    if mode == "0":
        return None
    with _lock:
        if _library is None and _failure is None:
            try:
                _library = _load()
            except (OSError, AttributeError, subprocess.SubprocessError) as error:
                _failure = str(error)
                if mode == "auto":
                    warnings.warn(
                        f"nlmodels: native CPU kernels unavailable ({_failure}); using the "
                        "pure-torch path (same results, ~1.7x slower on the CPU). Set "
                        "NLLAB_NATIVE=0 to silence this.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
    if _library is None and mode == "1":
        raise NativeUnavailable(f"NLLAB_NATIVE=1 but the native kernels failed: {_failure}")
    return _library


def native_enabled() -> bool:
    """Whether the native kernels are in use in this process."""
    return kernels() is not None


def _float64_cpu(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.float64 and tensor.device.type == "cpu"


def usable(*tensors: torch.Tensor) -> bool:
    """True when the kernels apply: all tensors float64 on the CPU, and the library loads."""
    return all(_float64_cpu(t) for t in tensors) and kernels() is not None


def call(name: str, *args: object) -> int | None:
    """Call kernel ``name``; tensor arguments are passed as data pointers (checked to be
    contiguous float64), and stay referenced by ``args`` for the whole call, so a temporary
    tensor in the argument list cannot be freed while C writes to it."""
    converted = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if not (arg.is_contiguous() and _float64_cpu(arg)):
                raise ValueError(f"{name}: native kernels need contiguous float64 CPU tensors")
            converted.append(arg.data_ptr())
        else:
            converted.append(arg)
    lib = kernels()
    if lib is None:
        raise NativeUnavailable(f"native kernels are not loaded (called {name})")
    return getattr(lib, name)(*converted)
