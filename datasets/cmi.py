"""k-nearest-neighbour estimators of mutual information and conditional mutual information.

The KSG estimator (Kraskov, Stögbauer & Grassberger, "Estimating mutual information", Phys.
Rev. E 69, 066138, 2004; their algorithm 1) and its conditional form as implemented in Greg Ver
Steeg's NPEET toolbox (the "non-parametric entropy estimation toolbox" the Neural Laplace paper
used for its CMI table, ``Table:CMI``):

    I(X; Y)     = ψ(k) + ψ(N) − ⟨ψ(n_x) + ψ(n_y)⟩
    I(X; Y | Z) = ψ(k) − ⟨ψ(n_xz) + ψ(n_yz) − ψ(n_z)⟩

where, for each sample i, ε_i is the max-norm distance to its k-th nearest neighbour in the joint
space, and n_· counts the samples strictly closer than ε_i in the marginal space named (the
sample itself included, as NPEET counts it). Neighbour searches use :class:`scipy.spatial.cKDTree`
with the Chebyshev metric. Like NPEET, a tiny seeded jitter breaks ties between equal values.

Pure numpy/scipy. Estimates are in nats unless ``base`` says otherwise (NPEET's default is 2).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.spatial import cKDTree
from scipy.special import digamma

__all__ = ["conditional_mutual_information", "gaussian_cmi", "gaussian_mi", "mutual_information"]

_JITTER = 1e-10


def _as_samples(a: ArrayLike, name: str, n: int | None = None) -> NDArray[np.float64]:
    x = np.asarray(a, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    elif x.ndim > 2:
        x = x.reshape(x.shape[0], -1)  # e.g. whole trajectories [N, T, D] -> [N, T·D]
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"{name} must hold at least 2 samples as rows, got shape {np.shape(a)}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} has {x.shape[0]} samples, expected {n} (one row per sample)")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def _jitter(x: NDArray[np.float64], rng: np.random.Generator) -> NDArray[np.float64]:
    scale = np.maximum(np.abs(x).mean(axis=0), 1.0)
    return x + _JITTER * scale * rng.random(x.shape)


def _kth_distance(points: NDArray[np.float64], k: int) -> NDArray[np.float64]:
    """Max-norm distance of every point to its k-th nearest other point."""
    dist, _ = cKDTree(points).query(points, k=k + 1, p=np.inf)
    return dist[:, k]


def _avg_digamma(points: NDArray[np.float64], radius: NDArray[np.float64]) -> float:
    """⟨ψ(count of points strictly within radius_i of point i, itself included)⟩."""
    tree = cKDTree(points)
    # Strictly closer: shrink the radius by a hair (as NPEET does).
    r = np.nextafter(radius, 0.0)
    counts = tree.query_ball_point(points, r, p=np.inf, return_length=True)
    return float(np.mean(digamma(np.asarray(counts, dtype=np.float64))))


def _check_k(k: int, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k < n:
        raise ValueError(f"k must be an integer in [1, {n - 1}] for {n} samples, got {k!r}")
    return int(k)


def mutual_information(
    x: ArrayLike, y: ArrayLike, *, k: int = 3, base: float = math.e, seed: int = 0
) -> float:
    """KSG estimate of I(X; Y) from paired samples (rows); ``[N]``, ``[N, d]`` or ``[N, ...]``."""
    xs = _as_samples(x, "x")
    ys = _as_samples(y, "y", xs.shape[0])
    n = xs.shape[0]
    k = _check_k(k, n)
    rng = np.random.default_rng(seed)
    xs, ys = _jitter(xs, rng), _jitter(ys, rng)
    eps = _kth_distance(np.hstack([xs, ys]), k)
    est = digamma(k) + digamma(n) - _avg_digamma(xs, eps) - _avg_digamma(ys, eps)
    return float(est / math.log(base))


def conditional_mutual_information(
    x: ArrayLike,
    y: ArrayLike,
    z: ArrayLike,
    *,
    k: int = 3,
    base: float = math.e,
    seed: int = 0,
) -> float:
    """KSG-type estimate of I(X; Y | Z) (NPEET's ``cmi``) from paired samples (rows)."""
    xs = _as_samples(x, "x")
    n = xs.shape[0]
    ys = _as_samples(y, "y", n)
    zs = _as_samples(z, "z", n)
    k = _check_k(k, n)
    rng = np.random.default_rng(seed)
    xs, ys, zs = _jitter(xs, rng), _jitter(ys, rng), _jitter(zs, rng)
    eps = _kth_distance(np.hstack([xs, ys, zs]), k)
    est = (
        digamma(k)
        - _avg_digamma(np.hstack([xs, zs]), eps)
        - _avg_digamma(np.hstack([ys, zs]), eps)
        + _avg_digamma(zs, eps)
    )
    return float(est / math.log(base))


def _logdet(cov: NDArray[np.float64], idx: list[int]) -> float:
    sign, val = np.linalg.slogdet(cov[np.ix_(idx, idx)])
    if sign <= 0:
        raise ValueError("covariance block is not positive definite")
    return float(val)


def gaussian_mi(cov: ArrayLike, x_idx: list[int], y_idx: list[int]) -> float:
    """Analytic I(X; Y) in nats of jointly Gaussian variables with covariance ``cov``."""
    c = np.asarray(cov, dtype=np.float64)
    return 0.5 * (_logdet(c, x_idx) + _logdet(c, y_idx) - _logdet(c, x_idx + y_idx))


def gaussian_cmi(cov: ArrayLike, x_idx: list[int], y_idx: list[int], z_idx: list[int]) -> float:
    """Analytic I(X; Y | Z) in nats of jointly Gaussian variables with covariance ``cov``."""
    c = np.asarray(cov, dtype=np.float64)
    return 0.5 * (
        _logdet(c, x_idx + z_idx)
        + _logdet(c, y_idx + z_idx)
        - _logdet(c, z_idx)
        - _logdet(c, x_idx + y_idx + z_idx)
    )
