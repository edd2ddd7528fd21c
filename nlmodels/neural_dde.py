"""Neural delay differential equation (neural DDE) with learnable constant delays.

Zhu, Guo & Lin (2021), "Neural delay differential equations" (ICLR), replace the neural ODE's
``x' = f(x(t))`` by ``x' = f(x(t), x(t − τ))``, whose solution depends on a history segment
rather than one point; Monsel, Semeraro, Mathelin & Charpiat (2024), "Neural state-dependent
delay differential equations" (with the solver library ``torchdde``), learn the delays
together with f. This forecaster has k learnable constant delays:

    x'(t) = f(t, x(t), x(t − τ_1), …, x(t − τ_k))

with f an MLP on ``[t, x, x(t − τ_1), …]`` (tanh, like the baselines' NODE), solved forward
from the last observation at the last observed time. Adapted to the suite's forecasting task:

* the history is the observed prefix itself, linearly interpolated between its points and held
  at its first value before them (the systems' own histories are constant, and unobserved);
* each delay is ``τ_i = W · sigmoid(θ_i)``, W the observed window ``t_last − t_first`` of each
  trajectory, so a delay never reaches before the observations; the θ_i start evenly spread,
  ``τ_i = W i / (k + 1)``. A prefix of one point has W = 0: the model is then an ODE;
* the solver is this module's own, :func:`dde_solve`: fixed steps on the prediction grid (as the
  baselines' NODE), each interval cut into ``substeps``, classical RK4 or Euler, batched over
  trajectories with each one's own grid and delays, differentiable with respect to the delays
  (the delayed state is a smooth function of the delayed time). ``torchdde`` was not used: its
  integrator takes one start time for the whole batch and reads the state on the host at every
  step (no per-sample grids, no ``torch.func.vmap`` for packed training).

Size: 17,283 parameters for D = 1 with the defaults (two hidden layers of 128 and two delays),
beside NODE's 17,025 and ANODE's 17,282 (Neural Laplace paper, Table 7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, get_args

import torch
from torch import nn

from nlmodels.base import ForecastModel, host_bool
from nlmodels.baselines._mlp import mlp
from nlmodels.baselines._solve import check_inputs
from nlmodels.model_registry import register_model

__all__ = ["MAX_DELAYS", "MAX_SUBSTEPS", "DelayField", "NeuralDDE", "Scheme", "dde_solve"]

#: ``f(t [B], x [B, D], delayed [B, k, D]) -> [B, D]``
DelayField = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
#: The fixed-step schemes of :func:`dde_solve`.
Scheme = Literal["rk4", "euler"]
#: The most solver steps per prediction interval and the most delays a model takes.
MAX_SUBSTEPS = 64
MAX_DELAYS = 32


def _hermite(piece: torch.Tensor, u: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Cubic Hermite interpolant of ``piece [..., 4, D]`` (left value, right value, left slope,
    right slope) at fractions ``u [...]`` of intervals of lengths ``h [...]``."""
    u, h = u.unsqueeze(-1), h.unsqueeze(-1)
    u2 = u * u
    u3 = u2 * u
    xl, xr, dl, dr = piece.unbind(-2)
    return (
        (2 * u3 - 3 * u2 + 1) * xl
        + (u3 - 2 * u2 + u) * h * dl
        + (3 * u2 - 2 * u3) * xr
        + (u3 - u2) * h * dr
    )


def _locate(
    knots: torch.Tensor, s: torch.Tensor, last: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the times ``s [B, M, k]`` fall: the piece ``j`` between ``knots[:, j]`` and
    ``knots[:, j + 1]`` (at most ``last [M]``, the last piece known when ``s`` is read; a time
    before the first knot is moved to it), the fraction ``u`` of that piece and its length
    ``h``, each ``[B, M, k]``."""
    shape = s.shape
    s = torch.maximum(s, knots[:, :1, None]).reshape(shape[0], -1)
    # a copy, not .contiguous(): a one-row slice counts as contiguous but keeps its row stride,
    # which torch's bucketization still copies (and warns about)
    j = torch.searchsorted(knots[:, 1:-1].clone(), s.detach(), right=True)
    j = torch.minimum(j.view(shape), last[:, None]).reshape(shape[0], -1)
    left, right = knots.gather(1, j), knots.gather(1, j + 1)
    h = right - left
    u = (s - left) / torch.where(h > 0, h, torch.ones_like(h))
    return j.view(shape), u.view(shape), h.view(shape)


def _read(
    done: torch.Tensor,
    x: torch.Tensor,
    slope: torch.Tensor,
    where: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    """The path at located times (``j, u, h [B, m]``, see :func:`_locate`), ``[B, m, D]``: on
    the finished pieces ``done [B, J, 4, D]``, or, on piece J, the step being taken, along the
    slope at its start (state ``x``, ``slope`` ``[B, D]``)."""
    j, u, h = where
    n = done.shape[1]
    index = j.clamp(max=n - 1)[..., None, None].expand(-1, -1, *done.shape[2:])
    on_done = _hermite(done.gather(1, index), u, h)
    ahead = x.unsqueeze(1) + (u * h).unsqueeze(-1) * slope.unsqueeze(1)
    return torch.where((j == n).unsqueeze(-1), ahead, on_done)


def _step_grid(t0: torch.Tensor, query_t: torch.Tensor, substeps: int) -> torch.Tensor:
    """The solver's nodes ``[B, Q · substeps + 1]``: ``[t0, query_t]`` with each interval cut
    into ``substeps`` equal steps (every ``substeps``-th node is a query time)."""
    grid = torch.cat([t0.unsqueeze(1), query_t], dim=1)
    frac = torch.arange(substeps, dtype=grid.dtype, device=grid.device) / substeps
    left, width = grid[:, :-1, None], (grid[:, 1:] - grid[:, :-1]).unsqueeze(-1)
    inner = (left + width * frac).reshape(grid.shape[0], -1)
    return torch.cat([inner, grid[:, -1:]], dim=1)


def _history(hist_t: torch.Tensor, hist_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The history as knots ``[B, H + 1]`` and Hermite pieces ``[B, H, 4, D]``: a constant piece
    ending at the first observation, then linear pieces through the observations (equal end
    slopes, the secant: the cubic Hermite interpolant is then the straight line)."""
    first = hist_t[:, :1]
    knots = torch.cat([first - 1, hist_t], dim=1)
    xs = torch.cat([hist_x[:, :1], hist_x], dim=1)
    slope = (xs[:, 1:] - xs[:, :-1]) / (knots[:, 1:] - knots[:, :-1]).unsqueeze(-1)
    pieces = torch.stack([xs[:, :-1], xs[:, 1:], slope, slope], dim=2)
    return knots, pieces


def dde_solve(
    field: DelayField,
    hist_t: torch.Tensor,
    hist_x: torch.Tensor,
    query_t: torch.Tensor,
    delays: torch.Tensor,
    *,
    scheme: Scheme = "rk4",
    substeps: int = 1,
) -> torch.Tensor:
    """Solve ``x'(t) = field(t, x(t), x(t − delays))`` after a given history; ``[B, Q, D]``.

    Args:
        field: ``f(t [B], x [B, D], delayed [B, k, D]) -> [B, D]``.
        hist_t: ``[B, H]`` increasing history times; the solve starts at ``hist_t[:, -1]`` from
            ``hist_x[:, -1]``.
        hist_x: ``[B, H, D]`` history values: the path before the start is their linear
            interpolant, held constant before ``hist_t[:, 0]``.
        query_t: ``[B, Q]`` increasing times, none before the start.
        delays: ``[B, k]``, non-negative.
        scheme: ``rk4`` (classical Runge–Kutta) or ``euler``.
        substeps: solver steps per interval of ``[start, query_t]``.

    The delayed state is read from the path solved so far: a cubic Hermite interpolant of the
    nodes' states and slopes (the slope at each node is the field there), fourth order like
    RK4, and exact for a cubic path. Inside the step being taken (a delay shorter than the step)
    the path is extrapolated along the slope at the step's start. Each stage's delayed times
    are its time minus the delays, so the result is differentiable in the delays.
    """
    knots, pieces = _history(hist_t, hist_x)
    first, k = pieces.shape[1], delays.shape[1]  # the first solved piece, the delays
    nodes = _step_grid(hist_t[:, -1], query_t, substeps)
    knots = torch.cat([knots, nodes[:, 1:]], dim=1)
    # every delayed time read, located at once: the start's, then each step's at its middle
    # (RK4's middle stages) and at its end (the last stage and the slope at the new node)
    last = first - 1 + torch.arange(nodes.shape[1], device=nodes.device)  # known when read
    start = _locate(knots, nodes[:, :1, None] - delays[:, None], last[:1])
    mid_end = torch.cat([(nodes[:, :-1, None] + nodes[:, 1:, None]) / 2, nodes[:, 1:, None]], 2)
    steps = _locate(knots, mid_end.repeat_interleave(k, 2) - delays.repeat(1, 2)[:, None], last[1:])

    x = hist_x[:, -1]
    slope = field(nodes[:, 0], x, _read(pieces, x, x, tuple(a[:, 0] for a in start)))
    out = []
    for n in range(nodes.shape[1] - 1):
        t, t1 = nodes[:, n], nodes[:, n + 1]
        h = (t1 - t).unsqueeze(-1)
        late, at_end = _read(pieces, x, slope, tuple(a[:, n] for a in steps)).split(k, dim=1)
        if scheme == "rk4":
            k2 = field(t + h[:, 0] / 2, x + h / 2 * slope, late)
            k3 = field(t + h[:, 0] / 2, x + h / 2 * k2, late)
            k4 = field(t1, x + h * k3, at_end)
            x1 = x + h / 6 * (slope + 2 * k2 + 2 * k3 + k4)
        else:
            x1 = x + h * slope
        slope1 = field(t1, x1, at_end)
        pieces = torch.cat([pieces, torch.stack([x, x1, slope, slope1], dim=1)[:, None]], dim=1)
        x, slope = x1, slope1
        if (n + 1) % substeps == 0:
            out.append(x)
    return torch.stack(out, dim=1)


@register_model("neural_dde")
class NeuralDDE(ForecastModel):
    """Neural DDE forecaster: ``x' = f(t, x(t), x(t − τ_1), …, x(t − τ_k))`` with learnable
    constant delays (Zhu et al., 2021; Monsel et al., 2024), from the last observation, the
    observed prefix as history. See the module's docstring for the adaptation.

    Args:
        state_dim: D, the trajectory dimension.
        hidden: hidden widths of f (two layers of 128: 17,283 parameters for D = 1 and k = 2).
        delays: k, the number of learnable delays (1 to :data:`MAX_DELAYS`).
        scheme: the fixed-step scheme, ``rk4`` (4 evaluations of f a step) or ``euler`` (1).
        substeps: solver steps per interval of the prediction grid (1 to :data:`MAX_SUBSTEPS`).
        vector_field: replaces the MLP; maps ``[..., 1 + D (1 + k)]`` (time, state, then each
            delayed state) to ``[..., D]`` (used to inject a known field, e.g. in tests).
    """

    def __init__(
        self,
        state_dim: int,
        *,
        hidden: Sequence[int] = (128, 128),
        delays: int = 2,
        scheme: Scheme = "rk4",
        substeps: int = 1,
        vector_field: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= delays <= MAX_DELAYS:
            raise ValueError(f"delays must be between 1 and {MAX_DELAYS}, got {delays}")
        if not 1 <= substeps <= MAX_SUBSTEPS:
            raise ValueError(f"substeps must be between 1 and {MAX_SUBSTEPS}, got {substeps}")
        if scheme not in get_args(Scheme):
            raise ValueError(f"scheme must be one of {get_args(Scheme)}, got {scheme!r}")
        self.state_dim, self.n_delays = int(state_dim), int(delays)
        self.scheme, self.substeps = scheme, int(substeps)
        width = 1 + self.state_dim * (1 + self.n_delays)
        self.field = vector_field if vector_field is not None else mlp(width, hidden, state_dim)
        spread = torch.arange(1, self.n_delays + 1, dtype=torch.float64) / (self.n_delays + 1)
        #: θ: the delays are ``W · sigmoid(θ)``, W the observed window
        self.delay_logits = nn.Parameter(torch.logit(spread).to(torch.get_default_dtype()))

    def delays(self, obs_t: torch.Tensor) -> torch.Tensor:
        """The delays ``[B, k]`` for observation times ``obs_t [B, T_o]``: each a fraction
        ``sigmoid(θ_i)`` of the trajectory's observed window."""
        window = (obs_t[:, -1] - obs_t[:, 0]).unsqueeze(1)
        return window * torch.sigmoid(self.delay_logits.to(obs_t))

    def _f(self, t: torch.Tensor, x: torch.Tensor, delayed: torch.Tensor) -> torch.Tensor:
        self.count_nfe()
        return self.field(torch.cat([t.unsqueeze(-1), x, delayed.flatten(1)], dim=-1))

    def forward(
        self, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
    ) -> torch.Tensor:
        ot, qt = check_inputs(obs_t, obs_x, query_t, self.state_dim)
        if host_bool((qt[:, 0] < ot[:, -1]).any()):
            raise ValueError("query_t must not precede the last observed time")
        return dde_solve(
            self._f,
            ot,
            obs_x,
            qt,
            self.delays(ot),
            scheme=self.scheme,
            substeps=self.substeps,
        )
