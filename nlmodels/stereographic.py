"""The Riemann-sphere (stereographic) map of Neural Laplace (paper §4.2, eq. 5-6).

``u: C -> D = (-π, π] × [-π/2, π/2]`` sends ``s`` to the spherical coordinates of its stereographic
projection; ``v = u^{-1}``. Representing F(s) through (θ, φ) keeps poles (|F| → ∞) and zeros at
finite, bounded network outputs, which is why the paper learns g in these coordinates.
"""

from __future__ import annotations

import math

import torch

__all__ = ["from_sphere", "max_modulus_phi", "to_sphere"]


def to_sphere(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """u(s) = (θ, φ): θ = arg s ∈ (−π, π], φ = asin((|s|²−1)/(|s|²+1)) ∈ [−π/2, π/2].

    φ is computed as ``atan2(|s| − 1/|s|, 2)``, the same angle (sin φ = (|s|²−1)/(|s|²+1),
    cos φ = 2|s|/(|s|²+1), divided through by |s|) without asin's loss of precision near the poles;
    it gives φ = π/2 for |s| = ∞ and −π/2 for s = 0, and u(1/s) = (−θ, −φ) holds to rounding.
    """
    if not torch.is_complex(s):
        s = torch.complex(s, torch.zeros_like(s))
    theta = torch.atan2(s.imag, s.real)
    modulus = s.abs()
    phi = torch.atan2(modulus - modulus.reciprocal(), torch.full_like(modulus, 2.0))
    return theta, phi


def from_sphere(theta: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """v(θ, φ) = tan(φ/2 + π/4) · e^{iθ}, the inverse of :func:`to_sphere`."""
    radius = torch.tan(phi / 2 + math.pi / 4)
    return torch.polar(radius, theta)


def max_modulus_phi(max_modulus: float | None) -> float:
    """Largest φ whose point has |s| ≤ ``max_modulus`` (paper Appendix C low-pass option).

    ``None`` means no bound (φ_max = π/2).
    """
    if max_modulus is None:
        return math.pi / 2
    if not (max_modulus > 0 and math.isfinite(max_modulus)):
        raise ValueError(f"max_frequency must be a positive finite number, got {max_modulus}")
    m2 = float(max_modulus) ** 2
    return math.asin((m2 - 1.0) / (m2 + 1.0))
