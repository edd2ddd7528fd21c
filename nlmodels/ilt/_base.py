"""Shared base of the inverse Laplace transform (ILT) algorithms and their name registry.

Every algorithm is the two-step scheme of the paper (Neural Laplace, Appendix B): ILT-Query maps
each time t to Q complex points s, ILT-Compute combines F at those points into x(t). All the
linear ones are x(t) = Re Σ_q w_q(t) F(s_q(t)) with w_q(t) = τ(t) c_q, so the weights depend on
the time grid only and callers may cache them (:meth:`ILTAlgorithm.weights`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from nlmodels._registrar import name_registrar
from nlmodels.base import host_bool

__all__ = ["ILT_ALGORITHMS", "ILTAlgorithm", "get_ilt", "register_ilt"]

MIN_TERMS = 3

#: registry name -> algorithm class
ILT_ALGORITHMS: dict[str, type[ILTAlgorithm]] = {}

#: ``@register_ilt("name")``: class decorator adding an algorithm to :data:`ILT_ALGORITHMS`
register_ilt = name_registrar(ILT_ALGORITHMS, "ILT", "name")


def get_ilt(name: str = "fourier", terms: int = 33, **options: Any) -> ILTAlgorithm:
    """Build the ILT algorithm registered as ``name`` with ``terms`` reconstruction terms.

    ``options`` are the algorithm's own keyword settings (e.g. ``scale`` for ``fourier``).
    """
    if name not in ILT_ALGORITHMS:
        raise ValueError(f"unknown ILT algorithm {name!r}; valid names: {sorted(ILT_ALGORITHMS)}")
    cls = ILT_ALGORITHMS[name]
    valid = {f.name for f in dataclasses.fields(cls) if f.init} - {"terms"}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for ILT {name!r}; valid options: {sorted(valid)}"
        )
    return cls(terms=terms, **options)


def check_times(t: torch.Tensor) -> torch.Tensor:
    """Times as float64, rejecting non-positive or non-finite values (every ILT needs t > 0)."""
    t = torch.as_tensor(t)
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"times must be real, got dtype {t.dtype}")
    t = t.to(torch.float64)
    if t.numel() and not host_bool(torch.all(torch.isfinite(t) & (t > 0))):
        raise ValueError("times must be finite and > 0 (an ILT is undefined at t <= 0)")
    return t


@dataclass(frozen=True, kw_only=True)
class ILTAlgorithm:
    """Base class: ``query(t)`` gives the points s, ``reconstruct(F(s), t)`` gives x(t).

    Shapes: ``t`` is ``[..., T]``; ``query`` returns ``[..., T, Q]``; ``reconstruct`` takes
    ``fs`` of shape ``[..., T, Q]`` with ``t`` broadcastable to ``fs.shape[:-1]`` and returns
    the broadcast shape. Computations run in float64/complex128 on the device of the input
    and are differentiable with respect to ``fs``.
    """

    #: reconstruction terms as in the paper (FSI: 2N + 1)
    terms: int = 33

    name: ClassVar[str] = ""
    #: False where x(t) is not a fixed linear combination of F(s) (de Hoog's Padé acceleration)
    is_linear: ClassVar[bool] = True

    # Set in __post_init__ (the subclass's): the constants c_q of w_q(t) = τ(t) c_q, and the
    # constants as tensors, per device (:meth:`_constant`).
    _coef: np.ndarray = field(init=False, repr=False, compare=False)
    _device_constants: dict[tuple[str, torch.device], torch.Tensor] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if isinstance(self.terms, bool) or not isinstance(self.terms, int | np.integer):
            raise ValueError(f"terms must be an integer >= {MIN_TERMS}, got {self.terms!r}")
        if self.terms < MIN_TERMS:
            raise ValueError(f"terms must be >= {MIN_TERMS}, got {self.terms}")
        object.__setattr__(self, "_device_constants", {})

    # ----------------------------------------------------------------- subclass interface
    @property
    def n_query(self) -> int:  # pragma: no cover - abstract
        """Q, the number of points s per time."""
        raise NotImplementedError

    def _query(self, t: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _time_factor(self, t: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Real τ(t) of linear algorithms, whose weights factor as w_q(t) = τ(t) c_q."""
        raise NotImplementedError

    def _weights(self, t: torch.Tensor) -> torch.Tensor:
        coef = self._constant("coef", self._coef, t)
        return self._time_factor(t).unsqueeze(-1) * coef

    def _reconstruct(self, fs: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # Re Σ_q τ c_q fs_q = τ Re(fs @ c): the weights' factored form, as one matrix-vector
        # product (cheaper than forming [..., T, Q] weights every call).
        coef = self._constant("coef", self._coef, t)
        return (fs @ coef).real * self._time_factor(t)

    # ----------------------------------------------------------------- public API
    def query(self, t: torch.Tensor) -> torch.Tensor:
        """Points s at which F is needed: float64 ``[..., T]`` -> complex128 ``[..., T, Q]``."""
        return self._query(check_times(t))

    def weights(self, t: torch.Tensor) -> torch.Tensor:
        """complex128 ``[..., T, Q]`` with ``reconstruct(fs, t) == (fs * w).real.sum(-1)``.

        Depends on the time grid only, so a model can compute it once per grid.
        """
        if not self.is_linear:
            raise NotImplementedError(
                f"ILT {self.name!r} is nonlinear in F(s): it has no fixed weights"
            )
        return self._weights(check_times(t))

    def reconstruct(self, fs: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x(t) from ``fs = F(query(t))``: ``[..., T, Q]`` -> float64 ``[..., T]``."""
        t = check_times(t)
        fs = torch.as_tensor(fs)
        if fs.dim() == 0 or fs.shape[-1] != self.n_query:
            raise ValueError(
                f"fs must end in the {self.n_query} query points of ILT {self.name!r} "
                f"(terms={self.terms}), got shape {tuple(fs.shape)}"
            )
        try:
            torch.broadcast_shapes(t.shape, fs.shape[:-1])
        except RuntimeError as err:
            raise ValueError(
                f"times of shape {tuple(t.shape)} do not broadcast with fs of shape "
                f"{tuple(fs.shape)} (t must broadcast to fs.shape[:-1])"
            ) from err
        return self._reconstruct(fs.to(torch.complex128), t)

    def invert(self, F: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor) -> torch.Tensor:
        """x(t) for a transform ``F`` applied elementwise to complex tensors."""
        t = check_times(t)
        return self.reconstruct(F(self._query(t)), t)

    # ----------------------------------------------------------------- helpers
    def _constant(self, key: str, value: np.ndarray, like: torch.Tensor) -> torch.Tensor:
        """``value`` as a complex128 tensor on ``like``'s device, cached per device."""
        cache = self._device_constants
        k = (key, like.device)
        if k not in cache:
            cache[k] = torch.as_tensor(np.asarray(value, dtype=np.complex128), device=like.device)
        return cache[k]
