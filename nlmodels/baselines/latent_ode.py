"""Latent ODE with an ODE-RNN encoder (Rubanova et al., 2019), trained by its ELBO."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, cast, get_args

import torch
from torch import nn

from nlmodels.base import ForecastModel, MemberRun, recording_host_bools
from nlmodels.baselines._dopri import dopri5_lanes
from nlmodels.baselines._encoders import ODERNNEncoder
from nlmodels.baselines._mlp import mlp, stacked_linear, stacked_mlp
from nlmodels.baselines._solve import (
    check_inputs,
    check_obs,
    check_solver,
    odeint_grid,
    shared_grid,
)
from nlmodels.model_registry import register_model

__all__ = ["LatentODE"]

#: A captured latent solve runs CAPTURE_HEADROOM times the most iterations a solve of its pack
#: needed so far, and at least CAPTURE_FLOOR (:meth:`LatentODE.capture_iterations`).
CAPTURE_HEADROOM, CAPTURE_FLOOR = 2, 16

Z0Time = Literal["first_observed", "first_query"]
KLAverage = Literal["values", "latents"]
Predict = Literal["mean", "sample"]
Select = Literal["val_rmse", "val_loss"]


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
    summed KL over the predicted values; ``predict = "sample"`` predicts from one sample of
    q(z₀ | x), as its ``get_reconstruction(..., n_traj_samples=1)`` does when it is scored, instead
    of the posterior mean; ``select = "val_loss"`` keeps the weights of the best validation
    negative ELBO, as its ``train_and_test`` keeps the best ``validation_step`` loss, instead of
    the best validation RMSE (:attr:`selection_metric`).

    Default sizes give 18,069 parameters for D = 1 (paper, Table 7: 18,565).

    dopri5 (without the adjoint) on a time grid shared by the batch is solved by
    :func:`~nlmodels.baselines._dopri.dopri5_lanes` (torchdiffeq's dopri5, step for step), with
    the whole batch as one lane; packed training (:meth:`packed_losses`) solves one lane per
    member, so each member takes the steps its unpacked run takes.

    On CUDA a pack's training step is captured into a CUDA graph (:meth:`captures_packed`),
    whose replay cannot ask the host whether the solve is done: there the solve runs a fixed
    budget of masked iterations, each lane keeping its own step size and accept/reject
    decision (diffrax's ``max_steps`` loop; Kidger, 2021, §5), rather than a plan of step sizes
    fixed before capture, which would give up the error control. The budget is
    :data:`CAPTURE_HEADROOM` times the most iterations a solve of the pack has needed (counted
    in the capture's warm-up and on the device in every replay), captured again when the
    replays need more than half of it, and a solve that outgrows it is an error
    (:meth:`graph_epoch_end`). The paper profile's solves need 3-5 iterations in the first
    epoch and 8-20 within 30 epochs (``benchmarks/latent_ode_steps.py``): they grow as the
    field learns, hence a budget that follows them. Where it suffices the budgeted solve is
    bit for bit the unbudgeted one, so it is no part of a cell's configuration.
    ``solve_iterations`` fixes the budget of every packed solve, eager ones too: the CPU twin
    of a captured solve.
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
        predict: Predict = "mean",
        select: Select = "val_rmse",
    ) -> None:
        super().__init__()
        for name, value, allowed in (
            ("z0_time", z0_time, Z0Time),
            ("kl_average", kl_average, KLAverage),
            ("predict", predict, Predict),
            ("select", select, Select),
        ):
            if value not in get_args(allowed):
                raise ValueError(f"{name} must be one of {get_args(allowed)}, got {value!r}")
        self.z0_time, self.kl_average, self.predict = z0_time, kl_average, predict
        self.selection_metric = select
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
        self._peak_iterations = 0  # the most a budgeted solve (or a capture's warm-up) needed
        self._flags: tuple[torch.Tensor, torch.Tensor] | None = None  # see _budget_flags
        #: a fixed budget for every packed solve, also eager (the CPU twin of a captured one)
        self.solve_iterations: int | None = None
        self._captured_budget: int | None = None  # the smallest budget captured so far
        self._lane_nfe: torch.Tensor | None = None  # [M]: what the replays evaluated

    def reseed(self, seed: int) -> None:
        """Restart the streams of standard-normal samples at ``seed``: the ELBO's, and (seed
        + 1) the sampled predictions' (``predict = "sample"``), so that predicting never moves
        the training draws."""
        self._sample_seed = int(seed)
        self._sampler: torch.Generator | None = None
        self._predictor: torch.Generator | None = None

    def _stream(self, device: torch.device) -> torch.Generator:
        """The ELBO's stream on ``device`` (started at the seed where it is new there)."""
        if self._sampler is None or self._sampler.device != device:
            self._sampler = torch.Generator(device).manual_seed(self._sample_seed)
        return self._sampler

    def _standard_normal(self, like: torch.Tensor) -> torch.Tensor:
        return torch.randn(
            like.shape, generator=self._stream(like.device), dtype=like.dtype, device=like.device
        )

    def _prediction_z0(self, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """The z₀ a prediction decodes: the posterior mean, or one sample of it."""
        if self.predict == "mean":
            return mean
        if self._predictor is None or self._predictor.device != std.device:
            seed = (self._sample_seed + 1) % 2**63
            self._predictor = torch.Generator(std.device).manual_seed(seed)
        noise = torch.randn(
            std.shape, generator=self._predictor, dtype=std.dtype, device=std.device
        )
        return mean + std * noise

    def _evolve_hidden(
        self, h: torch.Tensor, dt: torch.Tensor, field: Callable | None = None
    ) -> torch.Tensor:
        field = self.rec_field if field is None else field
        step = (dt / self.encoder_steps).unsqueeze(-1)
        for _ in range(self.encoder_steps):
            self.count_nfe()
            h = h + step * field(h)
        return h

    def _f(self, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        self.count_nfe()
        return self.latent_field(z)  # autonomous, as in the reference

    def encode(self, obs_t: torch.Tensor, obs_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and std of z₀ (at each trajectory's first observed time), ``[B, K]``."""
        ot = check_obs(obs_t, obs_x, self.state_dim)
        return self._posterior(self.encoder(ot, obs_x, self._evolve_hidden))

    @staticmethod
    def _posterior(encoded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw = encoded.chunk(2, dim=-1)
        return mean, nn.functional.softplus(raw) + 1e-6

    def decode(self, t0: torch.Tensor, z0: torch.Tensor, query_t: torch.Tensor) -> torch.Tensor:
        """Solve the latent ODE from ``z0 [B, K]`` at ``t0 [B]``; decode at ``query_t [B, T_q]``."""
        grid = shared_grid(t0, query_t) if self._solves_in_lanes() else None
        if grid is None:
            z = odeint_grid(
                self._f,
                z0,
                t0,
                query_t,
                solver=self.solver,
                rtol=self.rtol,
                atol=self.atol,
                adjoint=self.adjoint,
                owner=self.latent_field,
            )
        else:
            z = self._solve_lanes(lambda z: self.latent_field(z[0]).unsqueeze(0), z0[None], grid)
            self.count_nfe(z.nfe[0])
            z = z.y[0].transpose(0, 1)
        return self.decoder(z)

    def _solves_in_lanes(self) -> bool:
        return self.solver == "dopri5" and not self.adjoint

    def _solve_lanes(
        self, field: Callable[[torch.Tensor], torch.Tensor], z0, grid, masked: bool = False
    ):
        """dopri5 of the autonomous ``field`` from ``z0 [L, B, K]`` through the shared ``grid``
        (``masked``: a pack's lanes, whose arithmetic must not depend on how many there are).

        Captured into a CUDA graph, the solve runs a fixed budget of iterations
        (:meth:`capture_iterations`), and a lane it leaves unfinished is noted for
        :meth:`graph_epoch_end`; in a capture's eager warm-up the iterations needed are noted."""
        lanes = z0.shape[0]
        capturing = z0.is_cuda and torch.cuda.is_current_stream_capturing()
        budget = self.capture_iterations() if capturing else None
        if budget is not None:
            self._captured_budget = min(budget, self._captured_budget or budget)
        if masked and self.solve_iterations is not None:
            budget = self.solve_iterations
        sol = dopri5_lanes(
            lambda t, z: field(z),
            z0,
            grid[:1].expand(lanes),
            grid[1:].expand(lanes, -1),
            rtol=self.rtol,
            atol=self.atol,
            masked=masked,
            iterations=budget,
        )
        if budget is not None:
            overrun, needed = self._budget_flags(z0.device)
            overrun.logical_or_(sol.unfinished.any())
            needed.copy_(torch.maximum(needed, (sol.accepted + sol.rejected).max()))
        elif masked and recording_host_bools():  # a capture's warm-up (host reads allowed)
            warm = int((sol.accepted + sol.rejected).max())
            self._peak_iterations = max(self._peak_iterations, warm)
            self._budget_flags(z0.device)  # made before the capture, which writes into them
        return sol

    def forward(
        self, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
    ) -> torch.Tensor:
        ot, qt = check_inputs(obs_t, obs_x, query_t, self.state_dim)
        mean, std = self.encode(ot, obs_x)
        return self.decode(self._z0_time(ot, qt), self._prediction_z0(mean, std), qt)

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
        return self._negative_elbo(mean, std, pred, target)

    def _negative_elbo(
        self, mean: torch.Tensor, std: torch.Tensor, pred: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        var = self.obs_std**2
        log_lik = -0.5 * ((target - pred) ** 2 / var + math.log(2 * math.pi * var))
        kl = 0.5 * (mean**2 + std**2 - 1.0 - 2.0 * torch.log(std)).sum(-1)
        values = target.shape[-2] * target.shape[-1]  # T_q · D
        if self.kl_average == "latents":
            kl = kl * (values / self.latent_dim)
        elbo = log_lik.sum(dim=(-2, -1)) - kl
        return -(elbo / values).mean(-1)  # [..., B] → [...]: one loss per member when stacked

    # ----- packed training (nltrain._packing) ---------------------------------------------

    def packs_itself(self) -> bool:
        """Packed exactly with dopri5 (one solver lane per member) or Euler; not the adjoint."""
        return not self.adjoint and self.solver in ("dopri5", "euler")

    def packed_losses(
        self,
        members: Sequence[ForecastModel],
        state: Mapping[str, torch.Tensor],
        run: MemberRun,
        obs_t: torch.Tensor,
        obs_x: torch.Tensor,
        query_t: torch.Tensor,
        target: torch.Tensor,
    ) -> torch.Tensor:
        """Each member's negative ELBO ``[M]``, as its :meth:`training_loss` computes it: the
        encoder, decoder and latent ODE of all members at once from their stacked weights, each
        member's sample drawn from its own stream (the draws its unpacked run makes), the latent
        ODE solved with one lane per member."""
        mean, std = self._packed_encode(state, obs_t, obs_x)
        latents = cast("Sequence[LatentODE]", members)  # members of this model's pack
        noise = torch.stack(
            [m._standard_normal(s) for m, s in zip(latents, std.unbind(0), strict=True)]
        )
        pred = self._packed_decode(members, state, run, obs_t, obs_x, query_t, mean + std * noise)
        return self._negative_elbo(mean, std, pred, target)

    def packed_forward(
        self,
        members: Sequence[ForecastModel],
        state: Mapping[str, torch.Tensor],
        run: MemberRun,
        obs_t: torch.Tensor,
        obs_x: torch.Tensor,
        query_t: torch.Tensor,
    ) -> torch.Tensor:
        """Each member's :meth:`forward` ``[M, B, T_q, D]`` (the posterior mean decoded, or
        each member's sample from its own prediction stream)."""
        mean, std = self._packed_encode(state, obs_t, obs_x)
        z0 = mean
        if self.predict == "sample":
            z0 = torch.stack(
                [
                    m._prediction_z0(mu, s)
                    for m, mu, s in zip(
                        cast("Sequence[LatentODE]", members),
                        mean.unbind(0),
                        std.unbind(0),
                        strict=True,
                    )
                ]
            )
        return self._packed_decode(members, state, run, obs_t, obs_x, query_t, z0)

    def _packed_encode(self, state, obs_t, obs_x) -> tuple[torch.Tensor, torch.Tensor]:
        if obs_t.dim() != 1:
            raise ValueError("packed Latent ODE training needs the members' shared time grid")
        ot = check_obs(obs_t, obs_x[0], self.state_dim)
        rec_field = stacked_mlp(self.rec_field, state, "rec_field.")
        encoded = self.encoder.stacked(
            state, "encoder.", ot, obs_x, lambda h, dt: self._evolve_hidden(h, dt, rec_field)
        )
        return self._posterior(encoded)

    def _packed_decode(self, members, state, run, obs_t, obs_x, query_t, z0) -> torch.Tensor:
        ot, qt = check_inputs(obs_t, obs_x[0], query_t, self.state_dim)
        t0 = self._z0_time(ot, qt)
        if not self._solves_in_lanes():  # Euler: a fixed grid, vmapped as it is
            return run(lambda m, z: m.decode(t0, z, qt), z0)
        grid = shared_grid(t0, qt)
        if grid is None:
            raise ValueError("packed Latent ODE training needs a time grid shared by the batch")
        field = stacked_mlp(self.latent_field, state, "latent_field.")
        sol = self._solve_lanes(field, z0, grid, masked=True)
        self._count_lanes(members, sol.nfe)
        return stacked_linear(state, "decoder.")(sol.y.transpose(1, 2))

    def _count_lanes(self, members: Sequence[ForecastModel], nfe: torch.Tensor) -> None:
        """Each member's evaluations, counted on the member; in a CUDA graph (whose replays run
        no Python) added on the device to counts :meth:`graph_epoch_end` hands over; in a
        capture's warm-up not at all, as a pack's warm-up steps count nothing."""
        if not recording_host_bools():
            for j, member in enumerate(members):
                member.count_nfe(nfe[j])
        elif nfe.is_cuda and torch.cuda.is_current_stream_capturing():
            cast(torch.Tensor, self._lane_nfe).add_(nfe)
        elif self._lane_nfe is None or self._lane_nfe.shape != nfe.shape:
            self._lane_nfe = torch.zeros_like(nfe)  # before the capture, which adds to it

    # ----- a solve captured into a CUDA graph: a fixed budget of iterations -------------------

    def _budget_flags(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(a budgeted solve left a lane unfinished, the most iterations one needed): device
        scalars that budgeted solves update and :meth:`graph_epoch_end` reads once an epoch."""
        if self._flags is None or self._flags[0].device != device:
            self._flags = (
                torch.zeros((), dtype=torch.bool, device=device),
                torch.zeros((), dtype=torch.long, device=device),
            )
        return self._flags

    def capture_iterations(self) -> int:
        """The iterations a solve captured into a CUDA graph runs: :data:`CAPTURE_HEADROOM`
        times the most any solve of this pack has needed so far (the capture's warm-up and the
        replays before it), and at least :data:`CAPTURE_FLOOR`."""
        return max(CAPTURE_FLOOR, CAPTURE_HEADROOM * self._peak_iterations)

    def captures_packed(self) -> bool:
        """A pack's step is captured with dopri5 on a fixed budget (:meth:`_solve_lanes`) or
        with Euler (a fixed grid); not through the adjoint."""
        return self.packs_itself()

    def graph_generators(self, members: Sequence[ForecastModel]) -> list[torch.Generator]:
        """Each member's stream of the ELBO's samples on its device."""
        return [cast("LatentODE", m)._stream(next(m.parameters()).device) for m in members]

    def graph_epoch_end(self, members: Sequence[ForecastModel]) -> str | None:
        """The evaluations the replays counted, handed to ``members``; and whether a budgeted
        solve needed more iterations than its budget (its outputs past the budget are NaN,
        which its member's step would take for a divergence)."""
        if self._lane_nfe is not None and self._lane_nfe.shape[0] == len(members):
            for member, nfe in zip(members, self._lane_nfe.clone(), strict=True):
                member.count_nfe(nfe)
            self._lane_nfe.zero_()
        if self._flags is None:
            return None
        overrun, needed = self._flags
        self._peak_iterations = max(self._peak_iterations, int(needed))
        if not bool(overrun):
            return None
        overrun.zero_()
        return (
            f"a Latent ODE solve on a fixed budget of dopri5 iterations (captured into a CUDA "
            f"graph) needed more than it ({self._peak_iterations} at least); train with "
            f"graphs=False (eager steps) or on the CPU"
        )

    def graph_recapture(self) -> bool:
        """Whether the replays have needed more than half the captured budget (more than the
        peak it was chosen from): the next capture then chooses one from what they needed, so
        that only a solve that more than doubles its needs within an epoch outgrows it. A
        capture costs two eager steps; the needs grow by a few iterations over many epochs."""
        budget = self._captured_budget
        if budget is None or CAPTURE_HEADROOM * self._peak_iterations <= budget:
            return False
        self._captured_budget = None  # the graphs are captured again, with a new budget
        return True
