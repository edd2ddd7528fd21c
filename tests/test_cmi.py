"""The KSG-type (conditional) mutual information estimator against Gaussians with known values."""

from __future__ import annotations

import numpy as np
import pytest

from datasets.cmi import (
    conditional_mutual_information,
    gaussian_cmi,
    gaussian_mi,
    mutual_information,
)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("seed", [0, 1])
def test_mi_of_correlated_gaussians(rho, seed):
    cov = np.array([[1.0, rho], [rho, 1.0]])
    s = np.random.default_rng(seed).multivariate_normal([0, 0], cov, size=3000)
    est = mutual_information(s[:, 0], s[:, 1], k=3)
    assert abs(est - gaussian_mi(cov, [0], [1])) < 0.05


def test_mi_of_multivariate_gaussians_and_base():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(3000, 2))
    b = 0.8 * a + 0.6 * rng.normal(size=(3000, 2))  # two independent pairs, ρ = 0.8 each
    truth = -np.log(1 - 0.8**2)  # 2 × (−½ log(1 − ρ²))
    assert abs(mutual_information(a, b) - truth) < 0.05
    bits = mutual_information(a, b, base=2)
    assert bits == pytest.approx(mutual_information(a, b) / np.log(2))


def _chain(seed: int, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """Z ~ N(0, 1), X = Z + e1, Y = X + e2: columns (Z, X, Y) and their covariance."""
    mix = np.array([[1.0, 0, 0], [1, 1, 0], [1, 1, 1]])
    cov = mix @ mix.T
    return np.random.default_rng(seed).multivariate_normal(np.zeros(3), cov, size=n), cov


@pytest.mark.parametrize("seed", [0, 1])
def test_cmi_of_gaussian_chain(seed):
    s, cov = _chain(seed)
    z, x, y = s[:, 0], s[:, 1], s[:, 2]
    expected = gaussian_cmi(cov, [1], [2], [0])  # ½ log 2 ≈ 0.347 nats
    assert expected == pytest.approx(0.5 * np.log(2))
    assert abs(conditional_mutual_information(x, y, z) - expected) < 0.05
    # Markov chain Z → X → Y: I(Z; Y | X) = 0, while I(Z; Y) > 0.
    assert abs(conditional_mutual_information(z, y, x)) < 0.05
    assert mutual_information(z, y) > 0.1


def test_deterministic_by_seed_and_shapes():
    s, _ = _chain(0, 500)
    traj = np.repeat(s[:, 1:2, None], 4, axis=1)  # [N, T, D] trajectories flatten to rows
    a = conditional_mutual_information(traj, s[:, 2], s[:, 0], seed=5)
    assert a == conditional_mutual_information(traj, s[:, 2], s[:, 0], seed=5)


def test_errors():
    x = np.zeros((10, 1))
    with pytest.raises(ValueError, match="samples"):
        mutual_information(x, np.zeros((9, 1)))
    with pytest.raises(ValueError, match="k must be"):
        mutual_information(x, x, k=10)
    with pytest.raises(ValueError, match="NaN"):
        mutual_information(np.full(10, np.nan), x)
