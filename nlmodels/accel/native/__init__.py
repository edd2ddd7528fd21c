"""Fused float64 CPU kernels (``kernels.c``), built once per machine and loaded with ctypes.

Why: on the CPU, Neural Laplace's training step is dominated not by FLOPs but by per-operator
overhead: the encoder GRU is ~200 sequential steps of tiny matrix products and gate maths, and
the decoder's output map is a chain of ~15 elementwise passes. These kernels run each of those
as a single vectorised loop (inline polynomial exp, sin and cos).
``benchmarks/compile_vs_native.py`` measures them against the pure-torch path, eager and under
``torch.compile``.

The kernels are plain C99, no Python or torch headers, so one quick build serves, with
the system C compiler (``$CC``, else ``cc``), at ``-O3``, for the target of the CPU numerics
mode (:mod:`nlmodels.numerics`: ``-march=x86-64-v3 -ffp-contract=off`` portable, ``-march=native``
native). How the build is cached,
verified (hash, owner and permissions) and first self-tested in a child process is in
:mod:`nlmodels.accel.native._store`.

``NLLAB_NATIVE`` selects the mode: ``auto`` (default: use the kernels when they build, else warn
once and keep the pure-torch path), ``0`` (never use them) or ``1`` (they must build: raise).
``NLLAB_NATIVE_MARCH`` overrides ``-march`` (e.g. ``haswell`` gives the AVX2 build).
Every kernel has a pure-torch twin that the tests hold it to.

:func:`call` checks every argument before C sees it: the count, each integer, and each tensor's
dtype, device, contiguity and exact shape against the sizes passed (the shapes each kernel
expects are in ``_KERNELS``), so a wrong size or a swapped argument raises ValueError instead of
reading or writing past a buffer.
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from nlmodels.accel.native import _store

__all__ = [
    "BuildInfo",
    "NativeUnavailable",
    "build_failure",
    "build_info",
    "call",
    "kernels",
    "library",
    "native_enabled",
    "usable",
]

_MODES = {"auto", "0", "1"}
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failure: str | None = None

Shape = tuple[int, ...]


@dataclass(frozen=True)
class _Kernel:
    """A kernel's C signature and the shape of each tensor argument, from its size arguments.

    ``params``: (name, kind) in C order; kind ``i64``/``int``/``double`` for scalars, ``tensor``
    for a float64 array, ``tensor?`` for one that may be None (NULL). ``shapes``: size arguments
    (by name) → the exact shape of each tensor argument.
    """

    params: tuple[tuple[str, str], ...]
    shapes: Callable[[SimpleNamespace], dict[str, Shape]]
    returns_status: bool = False


def _p(spec: str) -> tuple[tuple[str, str], ...]:
    """``"n:i64 x:tensor"`` → (("n", "i64"), ("x", "tensor"))."""
    return tuple((name, kind) for name, kind in (item.split(":") for item in spec.split()))


def _w_ih_size(a: SimpleNamespace) -> int:
    """Packed input weights of a stacked GRU: [3H][I] for layer 0, [3H][H] above."""
    return 3 * a.units * (a.n_inputs + (a.n_layers - 1) * a.units)


def _gru_shapes(a: SimpleNamespace) -> dict[str, Shape]:
    layers, units, steps, batch = a.n_layers, a.units, a.n_time, a.batch
    return {
        "x": (a.n_inputs, steps, batch),
        "w_ih": (_w_ih_size(a),),
        "w_hh": (layers, 3 * units, units),
        "b_ih": (layers, 3 * units),
        "b_hh": (layers, 3 * units),
        "states": (layers, units, steps + 1, batch),
        "gates": (layers, 4 * units, steps, batch),
        "grad_top": (units, batch),
        "g_w_ih": (_w_ih_size(a),),
        "g_w_hh": (layers, 3 * units, units),
        "g_b_ih": (layers, 3 * units),
        "g_b_hh": (layers, 3 * units),
        "d_x": (a.n_inputs, steps, batch),
    }


def _first_hidden_shapes(a: SimpleNamespace) -> dict[str, Shape]:
    time_rows = a.n if a.per_row else 1
    hidden = (a.n * a.n_time, a.units)
    return {
        "per_time": (time_rows, a.n_time, a.units),
        "per_traj": (a.n, a.units),
        "h1": hidden,
        "g": hidden,
        "g_time": (time_rows, a.n_time, a.units),
        "g_traj": (a.n, a.units),
    }


def _rows_units(a: SimpleNamespace) -> dict[str, Shape]:
    return {name: (a.rows, a.units) for name in ("h", "g")} | {
        "bias": (a.units,),
        "g_bias": (a.units,),
    }


def _sphere_forward_shapes(a: SimpleNamespace) -> dict[str, Shape]:
    outputs = 2 * a.dims * a.n_query
    weights = (a.n if a.per_row else 1, a.n_query, a.n_time)
    return {
        "out_t": (outputs, a.n * a.n_time),
        "bias": (outputs,),
        "w_abs": weights,
        "w_arg": weights,
        "x": (a.n, a.n_time, a.dims),
        "acc": (a.n_time,),
    }


def _sphere_backward_shapes(a: SimpleNamespace) -> dict[str, Shape]:
    outputs = 2 * a.dims * a.n_query
    return {
        "d_out_t": (outputs, a.rows),
        "grad_x": (a.rows, a.dims),
        "g_t": (outputs, a.rows),
        "g_bias": (outputs,),
        "gx_t": (a.dims * a.rows,),
    }


_DECODER_SIZES = "n:i64 n_time:i64 units:i64 dims:i64 n_query:i64 slice:i64"


def _decoder_shapes(a: SimpleNamespace) -> dict[str, Shape]:
    """nl_decoder_forward/backward: one chunk of the fused decoder, out_t laid out by slice."""
    outputs, rows = 2 * a.dims * a.n_query, a.n * a.n_time
    per_time = (a.n if getattr(a, "per_row_time", 0) else 1, a.n_time, a.units)
    weights = (a.n if getattr(a, "per_row_w", 0) else 1, a.n_query, a.n_time)
    hidden, per_traj = (rows, a.units), (a.n, a.units)
    layers = {"w2": (a.units, a.units), "b2": (a.units,), "w3": (outputs, a.units)}
    inputs = {"per_time": per_time, "per_traj": per_traj, **layers, "b3": (outputs,)}
    saved = {"h1": hidden, "h2": hidden, "out_t": (rows * outputs,), "d_out_t": (rows * outputs,)}
    state = {"x": (a.n, a.n_time, a.dims), "grad_x": (a.n, a.n_time, a.dims), "acc": (a.n_time,)}
    # each gradient has its input's shape
    grads = {f"g_{name.removeprefix('per_')}": shape for name, shape in inputs.items()}
    return {**inputs, "w_abs": weights, "w_arg": weights, **saved, **state, **grads}


_GRU_SIZES = "n_time:i64 batch:i64 n_inputs:i64 units:i64 n_layers:i64"
_MATMUL = (
    "batch:i64 m:i64 n:i64 k:i64 a:ptr a_batch:i64 a_row:i64 a_col:i64 b:ptr b_batch:i64 "
    "b_row:i64 b_col:i64 c:tensor"
)


def _matmul_shapes(s: SimpleNamespace) -> dict[str, Shape]:
    return {"c": (s.batch, s.m, s.n)}


_KERNELS = {
    "nl_gru_forward": _Kernel(
        _p(
            f"{_GRU_SIZES} x:tensor w_ih:tensor w_hh:tensor b_ih:tensor b_hh:tensor "
            "states:tensor gates:tensor"
        ),
        _gru_shapes,
        returns_status=True,
    ),
    "nl_gru_backward": _Kernel(
        _p(
            f"{_GRU_SIZES} x:tensor w_ih:tensor w_hh:tensor states:tensor gates:tensor "
            "grad_top:tensor g_w_ih:tensor g_w_hh:tensor g_b_ih:tensor g_b_hh:tensor d_x:tensor?"
        ),
        _gru_shapes,
        returns_status=True,
    ),
    "nl_first_hidden": _Kernel(
        _p("n:i64 n_time:i64 units:i64 per_row:int per_time:tensor per_traj:tensor h1:tensor"),
        _first_hidden_shapes,
    ),
    "nl_first_hidden_backward": _Kernel(
        _p("n:i64 n_time:i64 units:i64 per_row:int g:tensor h1:tensor g_time:tensor g_traj:tensor"),
        _first_hidden_shapes,
    ),
    "nl_bias_tanh": _Kernel(_p("rows:i64 units:i64 h:tensor bias:tensor"), _rows_units),
    "nl_tanh_backward": _Kernel(
        _p("rows:i64 units:i64 g:tensor h:tensor g_bias:tensor"), _rows_units
    ),
    "nl_sphere_out_forward": _Kernel(
        _p(
            "n:i64 n_time:i64 dims:i64 n_query:i64 per_row:int out_t:tensor bias:tensor "
            "w_abs:tensor w_arg:tensor phi_scale:double phi_centre:double x:tensor acc:tensor"
        ),
        _sphere_forward_shapes,
    ),
    "nl_sphere_out_backward": _Kernel(
        _p(
            "rows:i64 dims:i64 n_query:i64 d_out_t:tensor grad_x:tensor g_t:tensor "
            "g_bias:tensor gx_t:tensor"
        ),
        _sphere_backward_shapes,
    ),
    "nl_decoder_forward": _Kernel(
        _p(
            f"{_DECODER_SIZES} per_row_time:int per_time:tensor per_traj:tensor w2:tensor "
            "b2:tensor w3:tensor b3:tensor per_row_w:int w_abs:tensor w_arg:tensor "
            "phi_scale:double phi_centre:double h1:tensor h2:tensor out_t:tensor x:tensor "
            "acc:tensor"
        ),
        _decoder_shapes,
        returns_status=True,
    ),
    "nl_decoder_backward": _Kernel(
        _p(
            f"{_DECODER_SIZES} per_row_time:int w2:tensor w3:tensor h1:tensor h2:tensor "
            "d_out_t:tensor grad_x:tensor g_time:tensor g_traj:tensor g_w2:tensor g_b2:tensor "
            "g_w3:tensor g_b3:tensor"
        ),
        _decoder_shapes,
        returns_status=True,
    ),
    # raw operands: called only by nlmodels.accel.portable, which passes each tensor's own
    # strides and a fresh contiguous output (see there); `call` is not its path
    "nl_matmul": _Kernel(_p(_MATMUL), _matmul_shapes, returns_status=True),
    # nl_matmul by a chosen code (0 the plain loop, 1 the 256-bit tiles, 2 the 512-bit tiles;
    # status 2 where this CPU cannot run it): the tests hold every code to the plain loop
    "nl_matmul_isa": _Kernel(_p(f"which:int {_MATMUL}"), _matmul_shapes, returns_status=True),
    "nl_unary": _Kernel(_p("op:int kind:int n:i64 x:ptr y:ptr"), lambda s: {}, returns_status=True),
    "nl_vector_math": _Kernel(
        _p("op:int n:i64 x:tensor y:tensor"), lambda a: {"x": (a.n,), "y": (a.n,)}
    ),
}
#: Integer arguments with a fixed set of values (flags and selectors).
_CHOICES = {
    "per_row": (0, 1),
    "per_row_time": (0, 1),
    "per_row_w": (0, 1),
    "op": (0, 1, 2, 3, 4),
}
_CTYPES = {
    "i64": ctypes.c_int64,
    "int": ctypes.c_int,
    "double": ctypes.c_double,
    "tensor": ctypes.c_void_p,
    "tensor?": ctypes.c_void_p,
    "ptr": ctypes.c_void_p,  # a strided operand (see nl_matmul)
}


class NativeUnavailable(RuntimeError):
    """The native kernels were required (``NLLAB_NATIVE=1``) but could not be built or loaded."""


def _mode() -> str:
    mode = os.environ.get("NLLAB_NATIVE", "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise ValueError(f"NLLAB_NATIVE must be one of auto, 0, 1; got {mode!r}")
    return mode


def _load() -> ctypes.CDLL:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise OSError(f"no native kernels for {platform.system()} {platform.machine()}")
    library = _store.load_trusted()
    for name, kernel in _KERNELS.items():
        function = getattr(library, name)
        function.restype = ctypes.c_int if kernel.returns_status else None
        function.argtypes = [_CTYPES[kind] for _, kind in kernel.params]
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
                _failure = " ".join(str(error).split())  # one line (a compiler's stderr)
                if mode == "auto":
                    warnings.warn(
                        f"nlmodels: native CPU kernels unavailable ({_failure[:300]}); "
                        "Neural Laplace trains on the pure-torch path: slower, and not bitwise "
                        "(its runs will not match runs with the kernels). NLLAB_NATIVE=0 "
                        "silences this.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
    if _library is None and mode == "1":
        raise NativeUnavailable(f"NLLAB_NATIVE=1 but the native kernels failed: {_failure}")
    return _library


@dataclass(frozen=True)
class BuildInfo:
    """The native kernels' build on this machine: compiler flags (the CPU numerics mode's
    target), where the library is kept, and whether it loaded (else why not)."""

    flags: tuple[str, ...]
    library: str
    loaded: bool
    failure: str | None
    enabled_for_neural_laplace: bool


def build_info() -> BuildInfo:
    """Build (if needed) and load the library, and say how it went (never raises)."""
    lib = library()
    try:
        where = str(_store.target(_store.cache_dir()))
    except OSError as e:
        where = f"(no usable cache folder: {e})"
    return BuildInfo(_store.flags(), where, lib is not None, _failure, _mode() != "0")


def build_failure() -> str | None:
    """Why the library could not be built or loaded (None: it loaded, or was never tried)."""
    return _failure


def library() -> ctypes.CDLL | None:
    """The kernel library whatever ``NLLAB_NATIVE`` says (the portable matrix products need
    it even where Neural Laplace keeps its pure-torch path), or None when it cannot be built
    or loaded (:func:`build_failure` says why). Never warns."""
    global _library, _failure
    with _lock:
        if _library is None and _failure is None:
            try:
                _library = _load()
            except (OSError, AttributeError, subprocess.SubprocessError) as error:
                _failure = " ".join(str(error).split())
    return _library


_dispatch: tuple[ctypes.CDLL, Path, bool] | None = None


def dispatch_library() -> tuple[ctypes.CDLL, Path, bool]:
    """The portable operators' C++ registration library (``dispatch.cpp``, built and verified
    as the kernels are, for the torch this process imports), its path and whether it passed its
    check before (:func:`dispatch_passed`); OSError when it cannot be built or loaded."""
    global _dispatch
    with _lock:
        if _dispatch is None:
            library = _store.load_dispatch()
            for name, restype, argtypes in (
                ("nlp_install", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p]),
                ("nlp_uninstall", None, []),
            ):
                function = getattr(library[0], name)
                function.restype, function.argtypes = restype, argtypes
            _dispatch = library
    return _dispatch


def dispatch_passed(path: Path) -> None:
    """Record that the registration library at ``path`` gave the Python definitions' bits."""
    _store.mark_passed(path)


def native_enabled() -> bool:
    """Whether the native kernels are in use in this process."""
    return kernels() is not None


def _float64_cpu(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.float64 and tensor.device.type == "cpu"


def usable(*tensors: torch.Tensor) -> bool:
    """True when the kernels apply: all tensors float64 on the CPU, and the library loads."""
    return all(_float64_cpu(t) for t in tensors) and kernels() is not None


def _checked(name: str, args: tuple[object, ...]) -> list[object]:
    """The C arguments of kernel ``name`` (tensors as data pointers), after checking each one."""
    kernel = _KERNELS.get(name)
    if kernel is None:
        raise ValueError(f"unknown native kernel {name!r}; valid: {', '.join(sorted(_KERNELS))}")
    if len(args) != len(kernel.params):
        names = ", ".join(p for p, _ in kernel.params)
        raise ValueError(f"{name} takes {len(kernel.params)} arguments ({names}), got {len(args)}")
    if any(kind == "ptr" for _, kind in kernel.params):
        raise ValueError(f"{name} takes raw operands: nlmodels.accel.portable calls it")
    sizes = {}
    for (param, kind), arg in zip(kernel.params, args):
        if kind in ("i64", "int"):
            if isinstance(arg, bool) or not isinstance(arg, int) or arg < 0:
                raise ValueError(f"{name}: {param} must be an integer >= 0, got {arg!r}")
            if param in _CHOICES and arg not in _CHOICES[param]:
                raise ValueError(f"{name}: {param} must be one of {_CHOICES[param]}, got {arg}")
            sizes[param] = arg
        elif kind == "double" and not isinstance(arg, float | int):
            raise ValueError(f"{name}: {param} must be a number, got {type(arg).__name__}")
    expected = kernel.shapes(SimpleNamespace(**sizes))
    converted: list[object] = []
    for (param, kind), arg in zip(kernel.params, args):
        if kind == "tensor?" and arg is None:
            converted.append(None)
        elif kind.startswith("tensor"):
            if not isinstance(arg, torch.Tensor):
                raise ValueError(f"{name}: {param} must be a tensor, got {type(arg).__name__}")
            if not (arg.is_contiguous() and _float64_cpu(arg)):
                raise ValueError(
                    f"{name}: {param} must be a contiguous float64 CPU tensor (native kernels), "
                    f"got {arg.dtype} on {arg.device}, contiguous={arg.is_contiguous()}"
                )
            if tuple(arg.shape) != expected[param]:
                raise ValueError(
                    f"{name}: {param} has shape {tuple(arg.shape)}, expected {expected[param]} "
                    f"from the sizes passed ({', '.join(f'{k}={v}' for k, v in sizes.items())})"
                )
            converted.append(arg.data_ptr())
        else:
            converted.append(arg)
    return converted


def call(name: str, *args: object) -> int | None:
    """Call kernel ``name`` after checking every argument (see the module docstring); tensors are
    passed as data pointers and stay referenced by ``args`` for the whole call, so a temporary
    tensor in the argument list cannot be freed while C writes to it."""
    converted = _checked(name, args)
    lib = kernels()
    if lib is None:
        raise NativeUnavailable(f"native kernels are not loaded (called {name})")
    return getattr(lib, name)(*converted)
