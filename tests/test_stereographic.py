"""The Riemann-sphere map u(s) = (θ, φ) and its inverse v (paper eq. 5-6)."""

import math

import pytest
import torch

from nlmodels.stereographic import from_sphere, max_modulus_phi, to_sphere


def _points(seed: int = 0, n: int = 500) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    modulus = torch.exp(torch.randn(n, generator=g, dtype=torch.float64) * 4)
    angle = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * math.pi
    return torch.polar(modulus, angle)


def test_definition_matches_the_paper_formula():
    s = _points()
    theta, phi = to_sphere(s)
    a = s.abs() ** 2
    torch.testing.assert_close(theta, torch.atan2(s.imag, s.real))
    torch.testing.assert_close(phi, torch.asin((a - 1) / (a + 1)), atol=1e-7, rtol=0)
    assert bool(((theta > -math.pi) & (theta <= math.pi)).all())
    assert bool(((phi >= -math.pi / 2) & (phi <= math.pi / 2)).all())


def test_round_trip_v_of_u_is_identity():
    s = _points(1)
    rel = (from_sphere(*to_sphere(s)) - s).abs() / s.abs()
    # φ near ±π/2 carries |s| only through π/2 − |φ| ≈ 2/|s|: float64 conditioning ∝ max(|s|, 1/|s|)
    conditioning = torch.maximum(s.abs(), 1 / s.abs())
    assert bool((rel <= 1e-14 * (1 + conditioning)).all())


def test_unit_circle_is_the_equator_and_limits_are_the_poles():
    s = torch.polar(
        torch.ones(8, dtype=torch.float64), torch.linspace(-3, 3, 8, dtype=torch.float64)
    )
    _, phi = to_sphere(s)
    torch.testing.assert_close(phi, torch.zeros_like(phi), atol=1e-15, rtol=0)
    inf = torch.tensor([complex(math.inf, 0.0), complex(0.0, math.inf)], dtype=torch.complex128)
    _, phi_inf = to_sphere(inf)
    assert torch.equal(phi_inf, torch.full_like(phi_inf, math.pi / 2))
    theta0, phi0 = to_sphere(torch.zeros(1, dtype=torch.complex128))
    assert phi0.item() == -math.pi / 2 and theta0.item() == 0.0
    # approaching infinity / zero continuously
    _, phi_big = to_sphere(torch.tensor([1e12 + 0j], dtype=torch.complex128))
    assert abs(phi_big.item() - math.pi / 2) < 1e-11


def test_reciprocal_maps_to_negated_coordinates():
    s = _points(2)
    s = s[s.imag != 0]  # θ = π (negative reals) maps to -π, the same point on the boundary
    theta, phi = to_sphere(s)
    theta_r, phi_r = to_sphere(1 / s)
    torch.testing.assert_close(theta_r, -theta, rtol=0, atol=1e-13)
    torch.testing.assert_close(phi_r, -phi, rtol=0, atol=1e-13)


def test_real_input_and_gradients():
    x = torch.tensor([0.5, 2.0, -3.0], dtype=torch.float64)
    theta, _ = to_sphere(x)
    torch.testing.assert_close(theta, torch.tensor([0.0, 0.0, math.pi], dtype=torch.float64))
    th = torch.tensor([0.3, -1.2], dtype=torch.float64, requires_grad=True)
    ph = torch.tensor([0.1, -0.7], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: torch.view_as_real(from_sphere(a, b)), (th, ph))


def test_max_modulus_phi_bounds_the_modulus():
    phi_max = max_modulus_phi(3.0)
    radius = from_sphere(
        torch.tensor([0.0], dtype=torch.float64), torch.tensor([phi_max], dtype=torch.float64)
    ).abs()
    assert abs(radius.item() - 3.0) < 1e-12
    assert max_modulus_phi(None) == math.pi / 2
    with pytest.raises(ValueError, match="max_frequency"):
        max_modulus_phi(-1.0)
