"""CPU kernels of our own for the portable numerics mode: the same bits on every x86-64 CPU.

torch's CPU matrix products (``mm``, ``addmm``, ``bmm``, ``mv``, ``dot`` ... and so every
``nn.Linear``, GRU cell and their gradients) and many of its elementary functions (``exp``,
``tanh``, ``sin``, ``tan``, ``atan`` ...: its vector-maths header ``ATen/cpu/vml.h``) call MKL,
and MKL picks its code by CPU *vendor*: ``MKL_CBWR`` pins a code branch on Intel CPUs, but "on
non-Intel CPUs ... the AUTO branch is used instead" (oneMKL Developer Guide, *Getting Started with
Conditional Numerical Reproducibility*), so an AMD CPU rounds otherwise whatever is pinned. No
setting of MKL gives one set of bytes on every x86-64 CPU.

:func:`install` therefore replaces the CPU kernels of those operators in this process
(``torch.library``; autograd, ``vmap`` and the out/in-place forms all reach them) by one
definition each, computed by the native kernels (:mod:`nlmodels.accel.native`):

* **products** (``nl_matmul``): each element starts from its first product and adds the others
  in increasing order of the inner index, each by one fused multiply-add (a single rounding,
  IEEE 754-2008 ``fusedMultiplyAdd``, which every x86-64-v3 CPU has). Scaling and accumulation
  (``beta · self + alpha · product``) are element-wise torch operations, complex products four
  real ones, float32 products are computed in float64 and rounded once.
* **elementary functions** (``nl_unary``): glibc's vector maths library, always its AVX2
  variant, each element on its own (the same code on every such CPU), float32 through float64;
  complex arguments through C99's complex functions. ``sqrt`` too: exactly rounded by IEEE 754,
  yet torch's MKL path gives other bits on AMD CPUs.

Elementary operations (``+ × ÷ sqrt``, exactly rounded) and torch's own vectorised kernels
(``sigmoid``, ``pow`` ...: SLEEF at the pinned AVX2 kernel set) need nothing. CUDA tensors are
untouched.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import warnings
from collections.abc import Callable

import torch

from nlmodels.accel import native

__all__ = [
    "DISPATCHED",
    "ELEMENTARY",
    "OPERATORS",
    "dispatch",
    "install",
    "installed",
    "portable_matmul",
    "uninstall",
]

_lock = threading.Lock()
_library: torch.library.Library | None = None
_kernel: Callable[..., int] | None = None  # nl_matmul, bound once by install()
_unary: Callable[..., int] | None = None  # nl_unary

Shape = tuple[int, ...]


def _float64(a: torch.Tensor, b: torch.Tensor, shape: Shape, sizes: Shape) -> torch.Tensor:
    """float64 ``a @ b`` by ``nl_matmul``: ``sizes`` = (batch, m, k, n); ``a`` and ``b`` are
    [batch, m, k] and [batch, k, n] (or [m, k] and [k, n] with batch 1), read through their own
    strides; the result is a new contiguous tensor of ``shape``."""
    batch, m, k, n = sizes
    out = a.new_empty(shape)
    if batch and m and n:
        if _kernel is None:
            raise native.NativeUnavailable("portable products need the native kernels")
        sa, sb = a.stride(), b.stride()
        if len(sa) == 2:
            sa, sb = (0, *sa), (0, *sb)
        status = _kernel(batch, m, n, k, a.data_ptr(), *sa, b.data_ptr(), *sb, out.data_ptr())
        if status:
            raise MemoryError(f"portable matrix product {sizes}: no memory for its scratch")
    return out


def portable_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [B, m, k] @ b [B, k, n]`` (CPU) by the portable definition (after :func:`install`)."""
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"expected both matrices to have the same dtype, but got {a.dtype} and {b.dtype}"
        )
    batch, m, k = a.shape
    if b.shape[0] != batch or b.shape[1] != k:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, a.shape))} and "
            f"{'x'.join(map(str, b.shape))})"
        )
    n = b.shape[2]
    shape, sizes = (batch, m, n), (batch, m, k, n)
    if a.dtype == torch.float64:
        return _float64(a, b, shape, sizes)
    if a.dtype == torch.float32:
        return _float64(a.double(), b.double(), shape, sizes).float()
    if a.dtype.is_complex:
        # a lazily conjugated view (autograd's backward of every complex product) keeps its
        # data unconjugated: its parts must be read resolved, as the plain product reads them
        wide_a = a.resolve_conj().to(torch.complex128)
        wide_b = b.resolve_conj().to(torch.complex128)
        ar, ai, br, bi = wide_a.real, wide_a.imag, wide_b.real, wide_b.imag

        def real(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return _float64(x, y, shape, sizes)

        out = torch.complex(real(ar, br) - real(ai, bi), real(ar, bi) + real(ai, br))
        return out.to(a.dtype)
    # integers, bool, half precision: exact or rare; summed over the inner index by torch
    return (a.unsqueeze(-1) * b.unsqueeze(1)).sum(2)


# -- the operators ------------------------------------------------------------------------------
def _bad_dims(name: str, a: torch.Tensor, da: int, b: torch.Tensor, db: int) -> None:
    raise RuntimeError(
        f"{name}: expected {da}-D and {db}-D tensors, got {a.dim()}-D and {b.dim()}-D"
    )


def _scaled(self: torch.Tensor, product: torch.Tensor, beta, alpha) -> torch.Tensor:
    """``beta · self + alpha · product`` with torch's conventions (beta = 0 ignores ``self``,
    NaN included)."""
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    # product is our own fresh tensor: add in place (IEEE addition commutes, so the bits are
    # those of self + product) unless self would widen it
    addend = self if beta == 1 else self * beta
    if addend.dtype == product.dtype and addend.dim() <= product.dim():
        try:
            return product.add_(addend)
        except RuntimeError:  # addend broader than the product: the broadcasting sum below
            pass
    return addend + product


def _mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    if self.dim() != 2 or mat2.dim() != 2:
        _bad_dims("mm", self, 2, mat2, 2)
    (m, k), (k2, n) = self.shape, mat2.shape
    if self.dtype == torch.float64 and mat2.dtype == torch.float64 and k == k2:
        return _float64(self, mat2, (m, n), (1, m, k, n))  # the common case, no batch views
    return portable_matmul(self.unsqueeze(0), mat2.unsqueeze(0))[0]


def _bmm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    if self.dim() != 3 or mat2.dim() != 3:
        _bad_dims("bmm", self, 3, mat2, 3)
    (batch, m, k), (batch2, k2, n) = self.shape, mat2.shape
    if self.dtype == torch.float64 and mat2.dtype == torch.float64 and (batch, k) == (batch2, k2):
        return _float64(self, mat2, (batch, m, n), (batch, m, k, n))  # the common case
    return portable_matmul(self, mat2)


def _mv(self: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    if self.dim() != 2 or vec.dim() != 1:
        _bad_dims("mv", self, 2, vec, 1)
    return portable_matmul(self.unsqueeze(0), vec.reshape(1, -1, 1))[0, :, 0]


def _dot(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    if self.dim() != 1 or other.dim() != 1:
        _bad_dims("dot", self, 1, other, 1)
    if self.numel() != other.numel():
        raise RuntimeError(
            f"inconsistent tensor size, expected tensor [{self.numel()}] and src "
            f"[{other.numel()}] to have the same number of elements, but got {self.numel()} "
            f"and {other.numel()} elements respectively"
        )
    return portable_matmul(self.reshape(1, 1, -1), other.reshape(1, -1, 1)).reshape(())


def _vdot(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return _dot(self.conj() if self.is_complex() else self, other)


def _addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _scaled(self, _mm(mat1, mat2), beta, alpha)


def _baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _scaled(self, _bmm(batch1, batch2), beta, alpha)


def _addmv(self, mat, vec, *, beta=1, alpha=1):
    return _scaled(self, _mv(mat, vec), beta, alpha)


def _addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    products = _bmm(batch1, batch2)
    total = products[0] if products.shape[0] else products.new_zeros(products.shape[1:])
    for p in products[1:]:  # the batch summed in order, as the inner index
        total = total + p
    return _scaled(self, total, beta, alpha)


# -- elementary functions -----------------------------------------------------------------------
#: The functions replaced, in ``nl_unary``'s order (kernels.c); erf, erfc, erfinv are real only.
ELEMENTARY = (
    "exp", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "sqrt",
)  # fmt: skip
_REAL_ONLY = {"erf", "erfc", "erfinv"}
_KINDS = {torch.float64: 0, torch.float32: 1, torch.complex128: 2, torch.complex64: 3}


def _elementary(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    code = ELEMENTARY.index(name)

    def function(self: torch.Tensor) -> torch.Tensor:
        x = self
        if x.dtype == torch.float64 and x.is_contiguous() and _unary is not None:
            out = torch.empty_like(x)  # the common case, checks skipped
            _unary(code, 0, x.numel(), x.data_ptr(), out.data_ptr())
            return out
        if not (x.is_floating_point() or x.is_complex()):
            x = x.to(torch.get_default_dtype())  # integers and bool promote, as torch does
        if x.is_complex() and name in _REAL_ONLY:
            raise RuntimeError(f"{name} does not support complex input")
        kind = _KINDS.get(x.dtype)
        if kind is None:  # half precision: through float32, rounded back once
            return function(x.float()).to(x.dtype)
        x = x.contiguous()
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        if x.numel():
            if _unary is None:
                raise native.NativeUnavailable("portable kernels need the native kernels")
            _unary(code, kind, x.numel(), x.data_ptr(), out.data_ptr())
        return out

    function.__name__ = f"portable_{name}"
    return function


_FUNCTIONAL: dict[str, Callable[..., torch.Tensor]] = {
    name: _elementary(name) for name in ELEMENTARY
}
_IN_PLACE = ("addmm", "baddbmm", "addmv", "addbmm", *ELEMENTARY)


def _out(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def out_form(*args, out, **kwargs):
        result = fn(*args, **kwargs)
        out.resize_(result.shape)
        return out.copy_(result)

    return out_form


def _in_place(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def in_place_form(self, *args, **kwargs):
        return self.copy_(fn(self, *args, **kwargs))

    return in_place_form


_FUNCTIONAL |= {
    "mm": _mm,
    "bmm": _bmm,
    "mv": _mv,
    "dot": _dot,
    "vdot": _vdot,
    "addmm": _addmm,
    "baddbmm": _baddbmm,
    "addmv": _addmv,
    "addbmm": _addbmm,
}
#: Every form torch dispatches to a CPU kernel: functional, ``.out`` and in-place.
OPERATORS: dict[str, Callable[..., torch.Tensor]] = {
    **_FUNCTIONAL,
    **{f"{name}.out": _out(fn) for name, fn in _FUNCTIONAL.items()},
    **{f"{name}_": _in_place(_FUNCTIONAL[name]) for name in _IN_PLACE},
}


#: The operators that ``dispatch.cpp`` registers from C++ (their functional, ``.out`` and
#: in-place forms): a call reaches the kernels without Python; what it does not compute itself it
#: hands to the Python definition above through ``nlportable::<name>``.
DISPATCHED = ("mm", "bmm", "addmm", "baddbmm", *ELEMENTARY)
_FORMS = {f"{name}{form}" for name in DISPATCHED for form in ("", ".out", "_")}
_fallbacks: torch.library.Library | None = None  # nlportable::<name>, defined once per process
_dispatch: ctypes.CDLL | None = None  # the loaded dispatch.cpp while its operators are registered
DISPATCH_VARIABLE = "NLLAB_PORTABLE_DISPATCH"


def _define_fallbacks() -> None:
    """``nlportable::<name>``: the Python definition of each operator ``dispatch.cpp`` registers,
    for the cases it does not compute itself (kept for the process: C++ holds their handles)."""
    global _fallbacks
    if _fallbacks is not None:
        return
    library = torch.library.Library("nlportable", "DEF")
    for name in DISPATCHED:
        schema = str(getattr(torch.ops.aten, name).default._schema)
        library.define(schema.removeprefix("aten::"))
        library.impl(name, _FUNCTIONAL[name], "CPU")
    _fallbacks = library


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a.view(torch.int64) == b.view(torch.int64)).all())


def _dispatch_agrees() -> bool:
    """Whether the registered C++ operators give the Python definitions' bits on a few
    products (strided, batched, scaled) and functions."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(7, 5, 9, dtype=torch.float64, generator=gen)
    b = torch.randn(7, 9, 11, dtype=torch.float64, generator=gen)
    c = torch.randn(5, 11, dtype=torch.float64, generator=gen)
    checks = [
        (torch.mm(a[0], b[0]), _mm(a[0], b[0])),
        (torch.mm(a[1].T.contiguous().T, b[2]), _mm(a[1].T.contiguous().T, b[2])),
        (torch.bmm(a, b), _bmm(a, b)),
        (torch.addmm(c, a[3], b[4], beta=0.5, alpha=2.0), _addmm(c, a[3], b[4], beta=0.5, alpha=2)),
        (torch.baddbmm(c, a, b), _baddbmm(c, a, b)),
        *((getattr(torch, f)(c.abs() / 9), _FUNCTIONAL[f](c.abs() / 9)) for f in ELEMENTARY),
    ]
    return all(_same_bits(x, y) for x, y in checks)


def _install_dispatch(kernels: ctypes.CDLL) -> bool:
    """Register ``dispatch.cpp``'s operators (built and cached as the kernels are); False, and
    nothing registered, when it cannot be built or loaded, or gives other bits than the Python
    definitions (``$NLLAB_PORTABLE_DISPATCH=python``: not tried)."""
    global _dispatch
    if os.environ.get(DISPATCH_VARIABLE, "").strip().lower() == "python":
        return False
    try:
        shim, path, checked = native.dispatch_library()
    except (OSError, ImportError, subprocess.SubprocessError) as error:
        warnings.warn(
            f"nlmodels: the portable operators' C++ registration is unavailable "
            f"({' '.join(str(error).split())[:300]}); they dispatch through Python: the same "
            f"bits, slower. {DISPATCH_VARIABLE}=python silences this.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    _define_fallbacks()
    address = ctypes.cast
    status = shim.nlp_install(
        address(kernels.nl_matmul, ctypes.c_void_p),
        address(kernels.nl_unary, ctypes.c_void_p),
        ",".join(ELEMENTARY).encode(),
    )
    if status != 0:
        return False
    if not checked:
        if not _dispatch_agrees():
            shim.nlp_uninstall()
            warnings.warn(
                f"nlmodels: the portable operators' C++ registration {path} computes other bits "
                "than their Python definitions: not used.",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        native.dispatch_passed(path)
    _dispatch = shim
    return True


def install() -> bool:
    """Route this process's CPU matrix products and elementary functions through the portable
    definitions (idempotent): the common operators registered from C++ where that builds
    (:data:`DISPATCHED`), every other one by its Python definition.
    False, and nothing changed, when the native kernels are unavailable."""
    global _library, _kernel, _unary
    with _lock:
        if _library is not None:
            return True
        kernels = native.library()
        if kernels is None:
            return False
        _kernel, _unary = kernels.nl_matmul, kernels.nl_unary
        in_cpp = _install_dispatch(kernels)
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            # torch warns once that a registered kernel is overridden: that is the point
            warnings.simplefilter("ignore", UserWarning)
            for name, fn in OPERATORS.items():
                if not (in_cpp and name in _FORMS):
                    library.impl(name, fn, "CPU")
        _library = library
        return True


def dispatch() -> str:
    """How the portable operators reach the kernels: ``C++``, ``Python``, or ``none`` (not
    installed)."""
    if _library is None:
        return "none"
    return "C++" if _dispatch is not None else "Python"


def uninstall() -> None:
    """Give torch's own CPU kernels back (benchmarks compare the two in one process)."""
    global _library, _dispatch
    with _lock:
        if _library is not None:
            _library._destroy()
            _library = None
        if _dispatch is not None:
            _dispatch.nlp_uninstall()
            _dispatch = None


def installed() -> bool:
    """Whether this process's CPU matrix products and elementary functions run the portable
    definitions."""
    return _library is not None
