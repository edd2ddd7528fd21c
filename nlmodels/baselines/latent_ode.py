"""Latent ODE with an ODE-RNN encoder (Rubanova et al., 2019), trained by its ELBO."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, get_args

import torch
from torch import nn

from nlmodels.base import ForecastModel
from nlmodels.baselines._encoders import ODERNNEncoder
from nlmodels.baselines._mlp import mlp
from nlmodels.baselines._solve import check_inputs, check_obs, check_solver, odeint_grid
from nlmodels.model_registry import register_model

__all__ = ["LatentODE"]

Z0Time = Literal["first_observed", "first_query"]
KLAverage = Literal["values", "latents"]


@register_model("latent_ode")
class LatentODE(ForecastModel):
    """Latent ODE (Rubanova et al., 2019; after Chen et al., 2018).

    An ODE-RNN encoder (GRU with ``rec_units`` units whose hidden state follows an ODE between
    observations, Euler steps as in the reference code) reads the observations backwards and gives
    the Gaussian posterior q(z₀ | x) over the latent state at the first observed time. The latent
    ODE ``dz/dt = f(z)`` is solved by dopri5 (rtol 1e−3, atol 1e−4) through the query times and
    a linear decoder maps z to the state. ``forward`` decodes the posterior mean;
    :meth:`training_loss` is the negative ELBO with observation std ``obs_std`` (0.01).

    Two choices of the paper's reference code (its ``latent_ode_lib``, after Rubanova et al.)
    are options: ``z0_time = "first_query"`` places the encoded z₀ at the first *predicted*
    time, as its ``DiffeqSolver`` starts the solve at ``time_steps_to_predict[0]`` (the latent
    path then skips the observed window); ``kl_average = "latents"`` weighs the KL term by its
    mean over latent dimensions, as its ``compute_all_losses`` does, instead of spreading the
    summed KL over the predicted values.

    Default sizes give 18,069 parameters for D = 1 (paper, Table 7: 18,565).
    """

    def __init__(
        self,
        state_dim: int,
        *,
        latent_dim: int = 2,
        rec_units: int = 40,
        rec_hidden: Sequence[int] = (40, 40),
        head_hidden: Sequence[int] = (100,),
        ode_hidden: Sequence[int] = (40, 40, 40),
        obs_std: float = 0.01,
        solver: str = "dopri5",
        rtol: float = 1e-3,
        atol: float = 1e-4,
        encoder_steps: int = 1,
        adjoint: bool = False,
        z0_time: Z0Time = "first_observed",
        kl_average: KLAverage = "values",
    ) -> None:
        super().__init__()
        for name, value, allowed in (
            ("z0_time", z0_time, Z0Time),
            ("kl_average", kl_average, KLAverage),
        ):
            if value not in get_args(allowed):
                raise ValueError(f"{name} must be one of {get_args(allowed)}, got {value!r}")
        self.z0_time, self.kl_average = z0_time, kl_average
        if obs_std <= 0:
            raise ValueError(f"obs_std must be > 0, got {obs_std}")
        if encoder_steps < 1:
            raise ValueError(f"encoder_steps must be >= 1, got {encoder_steps}")
        self.state_dim, self.latent_dim = int(state_dim), int(latent_dim)
        self.obs_std = float(obs_std)
        self.solver = check_solver(solver)
        self.rtol, self.atol, self.adjoint = float(rtol), float(atol), bool(adjoint)
        self.encoder_steps = int(encoder_steps)
        self.encoder = ODERNNEncoder(state_dim, rec_units, 2 * self.latent_dim, head_hidden)
        self.rec_field = mlp(rec_units, rec_hidden, rec_units)
        self.latent_field = mlp(self.latent_dim, ode_hidden, self.latent_dim)
        self.decoder = nn.Linear(self.latent_dim, self.state_dim)
        # The reparametrised sample has a stream of its own, seeded from the global generator
        # once the weights are drawn: models trained side by side in one process never share
        # (or race for) draws, so a seed gives the same run with any neighbours.
        self.reseed(int(torch.randint(2**62, ()).item()))

    def reseed(self, seed: int) -> None:
        """Restart the stream of the ELBO's standard-normal samples at ``seed``."""
        self._sample_seed, self._sampler = int(seed), None

    def _standard_normal(self, like: torch.Tensor) -> torch.Tensor:
        if self._sampler is None or self._sampler.device != like.device:
            self._sampler = torch.Generator(like.device).manual_seed(self._sample_seed)
        return torch.randn(
            like.shape, generator=self._sampler, dtype=like.dtype, device=like.device
        )

    def _evolve_hidden(self, h: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        step = (dt / self.encoder_steps).unsqueeze(-1)
        for _ in range(self.encoder_steps):
            self.count_nfe()
            h = h + step * self.rec_field(h)
        return h

    def _f(self, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        self.count_nfe()
        return self.latent_field(z)  # autonomous, as in the reference

    def encode(self, obs_t: torch.Tensor, obs_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and std of z₀ (at each trajectory's first observed time), ``[B, K]``."""
        ot = check_obs(obs_t, obs_x, self.state_dim)
        mean, raw = self.encoder(ot, obs_x, self._evolve_hidden).chunk(2, dim=-1)
        return mean, nn.functional.softplus(raw) + 1e-6

    def decode(self, t0: torch.Tensor, z0: torch.Tensor, query_t: torch.Tensor) -> torch.Tensor:
        """Solve the latent ODE from ``z0 [B, K]`` at ``t0 [B]``; decode at ``query_t [B, T_q]``."""
        z = odeint_grid(
            self._f,
            z0,
            t0,
            query_t,
            solver=self.solver,
            rtol=self.rtol,
            atol=self.atol,
            adjoint=self.adjoint,
            params=tuple(self.latent_field.parameters()),
        )
        return self.decoder(z)

    def forward(
        self, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
    ) -> torch.Tensor:
        ot, qt = check_inputs(obs_t, obs_x, query_t, self.state_dim)
        mean, _ = self.encode(ot, obs_x)
        return self.decode(self._z0_time(ot, qt), mean, qt)

    def _z0_time(self, obs_t: torch.Tensor, query_t: torch.Tensor) -> torch.Tensor:
        return obs_t[:, 0] if self.z0_time == "first_observed" else query_t[:, 0]

    def training_loss(
        self,
        obs_t: torch.Tensor,
        obs_x: torch.Tensor,
        query_t: torch.Tensor,
        target: torch.Tensor,
    ) -> torch.Tensor:
        """Negative ELBO per predicted value, averaged over the batch.

        ELBO_b = Σ log N(target | decode(z₀), obs_std²) − KL(q(z₀|x) ‖ N(0, I)), with one
        reparametrised sample of z₀ from the model's own stream (:meth:`reseed`); dividing by
        the number of values T_q·D keeps the scale independent of the grid length (the
        reference averages its likelihood likewise).
        With ``kl_average = "latents"`` the KL term is its mean over the K latent dimensions
        instead of its sum over T_q·D, as in the reference.
        """
        ot, qt = check_inputs(obs_t, obs_x, query_t, self.state_dim)
        if target.shape != (obs_x.shape[0], qt.shape[1], self.state_dim):
            raise ValueError(
                f"target must be [B, T_q, D] = {(obs_x.shape[0], qt.shape[1], self.state_dim)}, "
                f"got {tuple(target.shape)}"
            )
        mean, std = self.encode(ot, obs_x)
        z0 = mean + std * self._standard_normal(std)
        pred = self.decode(self._z0_time(ot, qt), z0, qt)
        var = self.obs_std**2
        log_lik = -0.5 * ((target - pred) ** 2 / var + math.log(2 * math.pi * var))
        kl = 0.5 * (mean**2 + std**2 - 1.0 - 2.0 * torch.log(std)).sum(-1)
        if self.kl_average == "latents":
            kl = kl * (target[0].numel() / self.latent_dim)
        elbo = log_lik.sum(dim=(1, 2)) - kl
        return -(elbo / target[0].numel()).mean()
