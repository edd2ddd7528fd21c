"""The Laplace Neural Operator (Cao, Goswami & Karniadakis, "Laplace neural operator for solving
differential equations", Nature Machine Intelligence 6 (2024) 631-640; code
github.com/qianyingcao/Laplace-Neural-Operator, MIT), adapted to forecasting.

The operator's Laplace layer is a linear time-invariant system with a pole–residue transfer
function per pair of channels, H(s) = Σ_n β_n / (s − μ_n), its poles μ_n and residues β_n learned.
The input function u, sampled on a uniform grid of N points with step Δt, is written through its
discrete Fourier transform α_l as a sum of poles λ_l = 2πi·fftfreq(N, Δt)_l with residues α_l/N,
U(s) = Σ_l (α_l/N)/(s − λ_l). The response Y = H U splits by partial fractions into

    y(t) = Σ_l (α_l/N) H(λ_l) e^{λ_l t}                           (steady state, the input's poles)
         + Σ_n β_n [Σ_l (α_l/N)/(μ_n − λ_l)] e^{μ_n t}            (transient, the system's poles),

the exact response, from rest at the grid's first time, of H to the trigonometric interpolant of
the samples. As in the paper's one-dimensional networks (width 4, 16 modes in its Duffing example):
a pointwise lift P: R^D → R^W, one Laplace layer plus a pointwise linear term W, and a projection
Q: R^W → 128 → R^D with ``sin`` between.

Adapted to this project's task (observed prefix → predictions at query times), written from the
paper (no code of the reference is used):

* The input function is the observed prefix, lifted by P, on its own grid (which must be uniform:
  the FFT of the method); t is measured from the first observed time. Each grid may be shared
  (``[T]``) or per trajectory (``[B, T]``, each with its own Δt).
* The discrete Fourier transform is a product with the DFT matrix (:func:`dft`), not an FFT:
  an FFT library picks its code by CPU (MKL's by vendor), the matrix products of the portable
  numerics (:mod:`nlmodels.numerics`) give the same bits on every CPU; at the N of an observed
  prefix (about 100 points) the N² products cost nothing beside the layer's other sums.
* The output function is evaluated at the query times through the two closed-form sums above
  (the paper's reconstruction at arbitrary locations), not by an inverse FFT on the input's grid:
  the prediction window lies after the input's. Beyond the window the steady-state part repeats
  with the input's period N·Δt (the DFT's periodic extension), the transient part does not.
* The pointwise term W u(t) needs the input at the output's time, which the prediction window does
  not have: the input is held at its last observed value there (zero-order hold), W u(t_last).
* Poles and residues are stored as real (Re, Im) pairs (so ``model.double()`` and the optimiser
  treat them as any weight) and initialised as the paper's, uniformly in [0, 1/W²) for both parts.

Size at the defaults (width 16, 15 modes, 128 projection units) for D = 1: 17,969 parameters
(Laplace layer 15,360, lift 32, W 272, projection 2,305), within the budget of the Neural Laplace
paper's baselines (Table 7, 17-18.5k).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from nlmodels._complex import complex_matmul
from nlmodels._options import require_positive_integers
from nlmodels.base import ForecastModel, batch_times, host_bool
from nlmodels.baselines._solve import check_obs
from nlmodels.model_registry import register_model

__all__ = ["LNO", "PoleResidue", "dft"]

#: relative spread of an observed grid's steps still taken as uniform
UNIFORM_TOLERANCE = 1e-3


def dft(u: torch.Tensor) -> torch.Tensor:
    """The discrete Fourier transform of real ``u`` along its last dimension, Σ_k u_k e^{−2πi kl/N}
    (``torch.fft.fft``'s convention), as two real products with the DFT matrix's cosines and sines;
    the angles are reduced exactly (kl mod N) before they are scaled."""
    n = u.shape[-1]
    k = torch.arange(n, device=u.device)
    theta = (2.0 * math.pi / n) * ((k[:, None] * k[None, :]) % n).to(u.dtype)  # [N, N]
    return torch.complex(u @ torch.cos(theta), -(u @ torch.sin(theta)))


class PoleResidue(nn.Module):
    """The Laplace layer: ``forward(u [B, W, N], dt, t)`` → the response ``[B, W, T]`` at times
    ``t`` after the input grid's first time, for ``dt`` ``[G]`` and ``t`` ``[G, T]`` (G = 1: one
    grid for all; G = B: each trajectory's own)."""

    def __init__(self, width: int, modes: int) -> None:
        super().__init__()
        scale = 1.0 / (width * width)
        self.poles = nn.Parameter(scale * torch.rand(width, width, modes, 2))
        self.residues = nn.Parameter(scale * torch.rand(width, width, modes, 2))

    def pole_residue(self) -> tuple[torch.Tensor, torch.Tensor]:
        """μ and β as complex ``[W_in, W_out, M]``."""
        return torch.view_as_complex(self.poles), torch.view_as_complex(self.residues)

    def forward(self, u: torch.Tensor, dt: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        mu, beta = self.pole_residue()
        n = u.shape[-1]
        alpha = dft(u) / n  # residues of the input's poles, [B, I, N]
        freq = torch.fft.fftfreq(n, dtype=u.dtype, device=u.device)  # cycles per step
        lam = (2j * math.pi) * freq / dt.unsqueeze(-1)  # input poles λ_l, [G, N]
        lam_ = lam[:, None, None, None, :]  # [G, 1, 1, 1, N]
        inv = 1.0 / (mu.unsqueeze(-1) - lam_)  # 1/(μ_n − λ_l), [G, I, O, M, N]
        transfer = -(beta.unsqueeze(-1) * inv).sum(-2)  # H(λ_l) = Σ_n β_n/(λ_l − μ_n), [G, I, O, N]
        steady = (alpha.unsqueeze(2) * transfer).sum(1)  # [B, O, N]
        # transient residues β_n Σ_l α_l/(μ_n − λ_l), [B, I, O, M]
        g, (i, o, m) = inv.shape[0], mu.shape
        flat = inv.reshape(g, i, o * m, n).transpose(-1, -2)  # [G, I, N, O·M]
        if g == 1:  # one grid: a product per input channel, no basis copied per trajectory
            gamma = complex_matmul(alpha.transpose(0, 1), flat[0]).transpose(0, 1)
        else:
            gamma = complex_matmul(alpha.unsqueeze(-2), flat).squeeze(-2)
        gamma = beta * gamma.view(-1, i, o, m)
        tc = t.to(lam.dtype)
        steady_basis = torch.exp(lam.unsqueeze(-1) * tc.unsqueeze(-2))  # [G, N, T]
        pole_basis = torch.exp(mu.unsqueeze(-1) * tc[:, None, None, None, :])  # [G, I, O, M, T]
        pole_basis = pole_basis.transpose(1, 2).reshape(g, o, i * m, -1)  # [G, O, I·M, T]
        gamma = gamma.transpose(1, 2).reshape(-1, o, i * m)  # [B, O, I·M]
        if g == 1:
            transient = complex_matmul(gamma.transpose(0, 1), pole_basis[0]).transpose(0, 1)
            return (complex_matmul(steady, steady_basis[0]) + transient).real
        transient = complex_matmul(gamma.unsqueeze(2), pole_basis).squeeze(2)
        return (complex_matmul(steady, steady_basis) + transient).real


@register_model("lno")
class LNO(ForecastModel):
    """Laplace Neural Operator from the observed prefix to the query times (module docstring).

    Args:
        state_dim: D, the trajectory dimension.
        width: W, the channels of the Laplace layer (paper's 1-D examples: 4).
        modes: M, the poles per pair of channels (paper's 1-D examples: 16).
        hidden: the projection's hidden units (paper: 128).
        activation: the projection's nonlinearity (paper: ``sin``; its code also offers ``tanh``).
    """

    def __init__(
        self,
        state_dim: int,
        *,
        width: int = 16,
        modes: int = 15,
        hidden: int = 128,
        activation: Literal["sin", "tanh"] = "sin",
    ) -> None:
        super().__init__()
        require_positive_integers(
            state_dim=state_dim,
            width=width,
            modes=modes,
            hidden=hidden,
        )
        if activation not in ("sin", "tanh"):
            raise ValueError(f"activation must be 'sin' or 'tanh', got {activation!r}")
        self.state_dim, self.activation = int(state_dim), activation
        self.lift = nn.Linear(self.state_dim, int(width))
        self.laplace = PoleResidue(int(width), int(modes))
        self.local = nn.Linear(int(width), int(width))  # the paper's pointwise W (a 1x1 conv)
        self.project = nn.Linear(int(width), int(hidden))
        self.out = nn.Linear(int(hidden), self.state_dim)

    def forward(
        self, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
    ) -> torch.Tensor:
        ot = check_obs(obs_t, obs_x, self.state_dim)  # [B, T_o]
        if ot.shape[1] < 2:
            raise ValueError("lno needs at least two observations (the input grid's step)")
        if query_t.dim() not in (1, 2) or query_t.shape[-1] < 1:
            raise ValueError(f"query_t must be [T] or [B, T], got shape {tuple(query_t.shape)}")
        qt = batch_times(query_t, obs_x.shape[0]).to(obs_x)  # [B, T_q]
        # one grid for all when every trajectory has the same times ([T], or [B, T] of equal
        # rows): the layer's [G, W, W, M, N] terms once rather than once per trajectory
        shared = obs_t.dim() == 1 and query_t.dim() == 1
        shared = shared or host_bool((ot == ot[:1]).all() & (qt == qt[:1]).all())
        grid = ot[:1] if shared else ot  # [G, T_o]
        steps = grid.diff(dim=-1)
        dt = steps.mean(-1)  # [G]
        spread = (steps - dt.unsqueeze(-1)).abs().amax(-1)
        if not host_bool(((dt > 0) & (spread <= UNIFORM_TOLERANCE * dt)).all()):
            raise ValueError(
                "lno needs an increasing, uniform observation grid (the FFT of its input function)"
            )
        t = (qt[:1] if shared else qt) - grid[:, :1]  # [G, T_q], from the input grid's first time
        self.count_nfe()
        u = self.lift(obs_x)  # [B, T_o, W]
        v = self.laplace(u.transpose(1, 2), dt, t).transpose(1, 2)  # [B, T_q, W]
        v = v + self.local(u[:, -1:, :])  # the pointwise term on the held last input
        z = self.project(v)
        z = torch.sin(z) if self.activation == "sin" else torch.tanh(z)
        return self.out(z)
