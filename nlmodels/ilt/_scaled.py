"""ILTs with nodes that scale as 1/t: x(t) ≈ (1/t) Re Σ_k η_k F(β_k / t).

Abate & Whitt ("A unified framework for numerically inverting Laplace transforms", INFORMS J.
Computing 18 (2006) 408-421) show that fixed Talbot, Gaver-Stehfest, Euler and CME all take
this form; each class below only computes its constant nodes β_k and weights η_k (float64 /
complex128, exact integer arithmetic where the formulas have factorials).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from importlib import resources

import numpy as np
import torch

from nlmodels.ilt._base import ILTAlgorithm, register_ilt

__all__ = ["CME", "Euler", "FixedTalbot", "Stehfest", "cme_parameters"]


@dataclass(frozen=True, kw_only=True)
class _ScaledNodes(ILTAlgorithm):
    """Shared query/weights of the x(t) ≈ (1/t) Re Σ η_k F(β_k/t) family."""

    _beta: np.ndarray = field(init=False, repr=False, compare=False)  # the nodes β_k

    def __post_init__(self) -> None:
        super().__post_init__()
        beta, eta = self._nodes()
        object.__setattr__(self, "_beta", np.asarray(beta, dtype=np.complex128))
        object.__setattr__(self, "_coef", np.asarray(eta, dtype=np.complex128))

    def _nodes(self) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def n_query(self) -> int:
        return len(self._beta)

    def _query(self, t: torch.Tensor) -> torch.Tensor:
        beta = self._constant("beta", self._beta, t)
        return beta * (1.0 / t).unsqueeze(-1)  # a real reciprocal: cheaper than complex division

    def _time_factor(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 / t


@register_ilt("talbot")
@dataclass(frozen=True, kw_only=True)
class FixedTalbot(_ScaledNodes):
    """Fixed Talbot (Abate & Valkó, Int. J. Numer. Meth. Eng. 60 (2004) 979-993).

    M = (terms − 1)//2 points on the deformed contour s(θ) = r θ (cot θ + i), r = 2M/(5t):
    x(t) = (r/M)[½ e^{rt} F(r) + Σ_{k=1}^{M−1} Re(e^{t s_k} F(s_k)(1 + iσ_k))],
    θ_k = kπ/M, σ_k = θ_k + (θ_k cot θ_k − 1) cot θ_k. Accurate for smooth non-oscillating
    x; e^{rt} amplifies rounding, so it degrades for oscillating x at long horizons.
    """

    def _nodes(self) -> tuple[np.ndarray, np.ndarray]:
        m = (self.terms - 1) // 2
        r = 2.0 * m / 5.0  # r·t
        theta = np.arange(1, m) * math.pi / m
        cot = 1.0 / np.tan(theta)
        beta = np.r_[r, r * theta * (cot + 1j)]
        sigma = theta + (theta * cot - 1.0) * cot
        eta = np.r_[0.5 * math.exp(r), np.exp(beta[1:]) * (1.0 + 1j * sigma)] * (r / m)
        return beta, eta


@cache
def _salzer_weights(m: int) -> tuple[float, ...]:
    """Stehfest's V_k, k = 1..m (m even), summed exactly in integers before rounding once."""
    h = m // 2
    fac = math.factorial
    weights = []
    for k in range(1, m + 1):
        total = Fraction(0)
        for j in range((k + 1) // 2, min(k, h) + 1):
            total += Fraction(
                j**h * fac(2 * j), fac(h - j) * fac(j) * fac(j - 1) * fac(k - j) * fac(2 * j - k)
            )
        weights.append(float((-1) ** (k + h) * total))
    return tuple(weights)


@register_ilt("stehfest")
@dataclass(frozen=True, kw_only=True)
class Stehfest(_ScaledNodes):
    """Gaver-Stehfest (Stehfest, Comm. ACM 13 (1970) 47-49), real nodes s_k = k ln2 / t.

    x(t) = (ln2/t) Σ_{k=1}^{M} V_k F(k ln2/t) with Salzer weights V_k. M = (terms − 1)//2,
    rounded up to even (the formula needs even M). The weights alternate in sign and grow
    like 10^{M/2}, so float64 loses accuracy for M beyond ~16-18.
    """

    def _nodes(self) -> tuple[np.ndarray, np.ndarray]:
        m = (self.terms - 1) // 2
        m += m % 2
        beta = np.arange(1, m + 1) * math.log(2.0)
        eta = np.asarray(_salzer_weights(m)) * math.log(2.0)
        return beta.astype(np.complex128), eta.astype(np.complex128)


@register_ilt("euler")
@dataclass(frozen=True, kw_only=True)
class Euler(_ScaledNodes):
    """Euler summation of the Fourier series (Abate & Whitt, ORSA J. Computing 7 (1995) 36-43).

    With N = (terms − 1)//2 and 2N + 1 points: β_k = N ln10/3 + iπk,
    η_k = 10^{N/3} (−1)^k ξ_k, ξ_0 = ½, ξ_k = 1 (1 ≤ k ≤ N), ξ_{2N} = 2^{−N},
    ξ_{2N−k} = ξ_{2N−k+1} + 2^{−N} C(N, k) (0 < k < N): binomial averaging of the last N
    partial sums of the alternating series.
    """

    def _nodes(self) -> tuple[np.ndarray, np.ndarray]:
        n = (self.terms - 1) // 2
        xi = [Fraction(1, 2)] + [Fraction(1)] * n + [Fraction(0)] * n
        xi[2 * n] = Fraction(1, 2**n)
        for j in range(1, n):
            xi[2 * n - j] = xi[2 * n - j + 1] + Fraction(math.comb(n, j), 2**n)
        k = np.arange(2 * n + 1)
        beta = n * math.log(10.0) / 3.0 + 1j * math.pi * k
        eta = 10.0 ** (n / 3.0) * np.where(k % 2 == 0, 1.0, -1.0) * np.array([float(v) for v in xi])
        return beta, eta.astype(np.complex128)


@cache
def cme_parameters() -> dict[int, dict]:
    """CME parameters by order n (n + 1 query points), fitted by ``scripts/fit_cme.py``."""
    text = resources.files("nlmodels.ilt").joinpath("data/cme_params.json").read_text()
    return {int(rec["n"]): rec for rec in json.loads(text)["orders"]}


@register_ilt("cme")
@dataclass(frozen=True, kw_only=True)
class CME(_ScaledNodes):
    """Concentrated matrix-exponential ILT (Horváth, Horváth, Almousa & Telek, 2020).

    x(t) is approximated by ∫ x(u) h_t(u) du, h_t a CME density of mean t and squared
    coefficient of variation cv² (minimised by ``scripts/fit_cme.py``); its exponential-sum form
    gives β_0 = μ₁, β_k = μ₁(1 + ikω), η_0 = cμ₁, η_k = μ₁(a_k + ib_k). Uses the largest
    fitted order n with n + 1 <= terms (n = 32 for terms = 33), i.e. n + 1 query points.
    """

    def _nodes(self) -> tuple[np.ndarray, np.ndarray]:
        params = cme_parameters()
        orders = [n for n in params if n + 1 <= self.terms]
        if not orders:  # pragma: no cover - order 1 is always shipped and terms >= 3
            raise ValueError(f"no CME order fits terms={self.terms}")
        p = params[max(orders)]
        k = np.arange(1, p["n"] + 1)
        mu1 = p["mu1"]
        beta = mu1 * np.r_[1.0, 1.0 + 1j * k * p["omega"]]
        eta = mu1 * np.r_[p["c"], np.asarray(p["a"]) + 1j * np.asarray(p["b"])]
        return beta, eta
