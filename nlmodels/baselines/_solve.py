"""Input checks and the ODE solve on shared or per-sample time grids (shared by the baselines)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torchdiffeq import odeint, odeint_adjoint

from nlmodels.base import batch_times, host_bool
from nlmodels.baselines._dopri_adjoint import dopri5_adjoint_eager
from nlmodels.baselines._euler import Field, euler_adjoint, euler_adjoint_eager, euler_steps

__all__ = [
    "ADAPTIVE_SOLVERS",
    "SOLVERS",
    "check_inputs",
    "check_obs",
    "check_solver",
    "odeint_grid",
    "shared_grid",
]

#: torchdiffeq methods that step on the output grid (one step per interval by default).
FIXED_SOLVERS = ("euler", "midpoint", "rk4", "explicit_adams", "implicit_adams")
#: torchdiffeq adaptive methods (error control with rtol/atol).
ADAPTIVE_SOLVERS = ("dopri5", "dopri8", "bosh3", "adaptive_heun", "fehlberg2")
SOLVERS = FIXED_SOLVERS + ADAPTIVE_SOLVERS


def check_solver(solver: str) -> str:
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; valid solvers: {', '.join(SOLVERS)}")
    return solver


def check_obs(obs_t: torch.Tensor, obs_x: torch.Tensor, state_dim: int) -> torch.Tensor:
    """Validate the observed prefix; return ``obs_t`` as ``[B, T_o]`` in x's dtype."""
    if obs_x.dim() != 3:
        raise ValueError(f"obs_x must be [B, T_o, D], got shape {tuple(obs_x.shape)}")
    if obs_x.shape[-1] != state_dim:
        raise ValueError(f"obs_x has state dimension {obs_x.shape[-1]}, model expects {state_dim}")
    if obs_x.shape[1] < 1:
        raise ValueError("obs_x must hold at least one observation")
    ot = _increasing("obs_t", batch_times(obs_t, obs_x.shape[0]).to(obs_x))
    if ot.shape[1] != obs_x.shape[1]:
        raise ValueError(f"obs_t has {ot.shape[1]} times but obs_x has {obs_x.shape[1]} points")
    return ot


def check_inputs(
    obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor, state_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate the forecasting inputs; return ``obs_t``, ``query_t`` as ``[B, T]`` in x's dtype."""
    ot = check_obs(obs_t, obs_x, state_dim)
    qt = _increasing("query_t", batch_times(query_t, obs_x.shape[0]).to(obs_x))
    if qt.shape[1] < 1:
        raise ValueError("query_t must hold at least one time")
    return ot, qt


def _increasing(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.shape[1] > 1 and not host_bool((t[:, 1:] > t[:, :-1]).all()):
        raise ValueError(f"{name} must be strictly increasing along each trajectory")
    return t


def _rows_equal(t: torch.Tensor) -> bool:
    return host_bool((t == t[:1]).all())


def shared_grid(t0: torch.Tensor, query_t: torch.Tensor) -> torch.Tensor | None:
    """The grid ``[t0, query_t…]`` as ``[T_q + 1]`` when every sample has the same one, else None.

    ``t0 [B]``, ``query_t [B, T_q]``; query times before the initial time are an error.
    """
    grid = torch.cat([t0.unsqueeze(1), query_t], dim=1)  # [B, T_q + 1]
    if host_bool((grid[:, 1] < grid[:, 0]).any()):
        raise ValueError("query times must not precede the model's initial time")
    return grid[0] if _rows_equal(grid) else None


def odeint_grid(
    field: Field,
    x0: torch.Tensor,
    t0: torch.Tensor,
    query_t: torch.Tensor,
    *,
    solver: str,
    rtol: float,
    atol: float,
    adjoint: bool = False,
    owner: nn.Module | None = None,
    count_nfe: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Solve ``dx/dt = field(t, x)`` from ``x0 [B, S]`` at times ``t0 [B]``; return ``[B, T_q, S]``.

    ``field`` receives ``t`` as a 0-d tensor (shared grid) or ``[B]`` (per-sample grids).
    Fixed-step solvers step on the output grid ``[t0, query_t]`` (the paper's protocol).

    Per-sample grids: when every row of ``[t0, query_t]`` is the same, one shared grid is
    solved. Otherwise each sample's grid is mapped to the common index grid τ = 0, 1, …, T_q by
    the piecewise-linear t_b(τ) through its own points, and the solver integrates
    ``dx/dτ = t_b'(τ) · field(t_b(τ), x)`` — an exact change of variables, so a fixed-step solver
    takes exactly the steps it would take on each sample's own grid, and an adaptive solver is
    told that t_b'(τ) jumps at the integers (``jump_t``).

    ``adjoint``: gradients by torchdiffeq's ``odeint_adjoint`` with the semi-norm, with respect
    to ``owner``'s parameters (the module ``field`` reads). Inside a pack (``torch.func.vmap``,
    where torchdiffeq's adjoint cannot run) an Euler solve on a shared grid takes its twin,
    :func:`nlmodels.baselines._euler.euler_adjoint`: the same arithmetic in batchable ops;
    outside a pack, an Euler solve takes :func:`~nlmodels.baselines._euler.euler_adjoint_eager`:
    torchdiffeq's bytes with less work (``count_nfe``: called for each evaluation of ``field``
    it reuses rather than makes again, so that the count is torchdiffeq's); a ``dopri5`` solve
    on a shared grid takes :func:`~nlmodels.baselines._dopri_adjoint.dopri5_adjoint_eager`,
    torchdiffeq's bytes with less work too.
    """
    shared = shared_grid(t0, query_t)
    options: dict = {}
    if shared is not None:
        times = shared
        # A first query at the initial time itself: x(t0) = x0 needs no extra grid point.
        start_at_query = host_bool(times[1] == times[0])
        if start_at_query:
            times = times[1:]
        func = field
    else:
        knots = torch.cat([t0.unsqueeze(1), query_t], dim=1)  # [B, T_q + 1]
        steps = knots[:, 1:] - knots[:, :-1]  # [B, T_q]
        last = steps.shape[1] - 1

        def func(tau: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            k = tau.detach().floor().clamp(0, last).long().view(1)
            dt = steps.index_select(1, k).squeeze(1)
            t = knots.index_select(1, k).squeeze(1) + (tau - k.to(tau)) * dt
            return dt.unsqueeze(-1) * field(t, x)

        times = torch.arange(knots.shape[1], dtype=x0.dtype, device=x0.device)
        start_at_query = False
        if solver in ADAPTIVE_SOLVERS and knots.shape[1] > 2:
            options["jump_t"] = times[1:-1]
    kwargs: dict = dict(rtol=rtol, atol=atol, method=solver, options=options or None)
    params = () if owner is None else tuple(owner.parameters())
    if adjoint and solver == "euler" and torch._C._functorch.is_functorch_wrapped_tensor(x0):
        if shared is None or owner is None:
            raise ValueError("a packed adjoint solve needs a grid shared by the batch and owner")
        sol = euler_adjoint(func, x0, times, owner)
    elif adjoint and solver == "euler":
        sol = euler_adjoint_eager(func, x0, times, owner, count=count_nfe)
    elif adjoint and solver == "dopri5" and not options:
        sol = dopri5_adjoint_eager(func, x0, times, owner, rtol=rtol, atol=atol)
    elif adjoint:
        adjoint_options = dict(norm="seminorm", **options)
        sol = odeint_adjoint(
            func,
            x0,
            times,
            adjoint_options=adjoint_options,
            adjoint_params=params,
            **kwargs,
        )
    elif solver == "euler":
        sol = euler_steps(func, x0, times)
    else:
        sol = odeint(func, x0, times, **kwargs)
    if not start_at_query:
        sol = sol[1:]
    return sol.transpose(0, 1)
