"""Neural ODE (Chen et al., 2018) and Augmented Neural ODE (Dupont et al., 2019) forecasters.

Neither has an encoder: as in the Neural Laplace paper (Appendix D) the initial value is the last
observed point, at the last observed time, and ``f(t, x)`` — an MLP on ``[t, x]`` with 128 tanh
units — is integrated over the prediction times (Euler on the prediction grid by default).

The paper's reference code (``experiments/baseline_models/original_ode_models.py`` of
samholt/NeuralLaplace) instead integrates over ``t = tp_to_predict`` alone from the last
observation, so its solution at the first query time *is* the last observation and the path
runs one step late: ``start = "first_query"`` reproduces that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, get_args

import torch
from torch import nn

from nlmodels.base import ForecastModel
from nlmodels.baselines._mlp import mlp
from nlmodels.baselines._solve import check_inputs, check_solver, odeint_grid
from nlmodels.model_registry import register_model

__all__ = ["ANODE", "NODE", "REFERENCE_TOLERANCES", "Start"]

#: Where the solve starts: at the last observed time (the paper's text), or at the first query
#: time with the last observation as its value (the reference code).
Start = Literal["last_observed", "first_query"]

#: The tolerances of the reference's adaptive NODE/ANODE solves: its ``odeint_adjoint`` call
#: (``experiments/baseline_models/original_ode_models.py``) passes none, so torchdiffeq's
#: defaults hold, for the solve and for its adjoint (which takes the solve's by default).
REFERENCE_TOLERANCES: Final[dict[str, float]] = {"rtol": 1e-7, "atol": 1e-9}


@register_model("node")
class NODE(ForecastModel):
    """Neural ODE forecaster (Chen et al., 2018): ``dx/dt = f(t, x)`` from the last observation.

    Args:
        state_dim: D, the trajectory dimension.
        hidden: hidden widths of ``f`` (paper: two layers of 128, 17,025 parameters for D = 1).
        augment_dim: zero-initialised extra state dimensions (ANODE, Dupont et al., 2019).
        solver: a torchdiffeq method; fixed-step ones step on the prediction grid.
        rtol, atol: tolerances of adaptive solvers.
        adjoint: back-propagate with the adjoint method and the semi-norm of Kidger et al. (2021),
            as the reference code's ``odeint_adjoint(..., adjoint_options={"norm": "seminorm"})``.
        start: ``last_observed`` (default): the last observation is the state at the last
            observed time; ``first_query``: it is the state at the first query time (the
            reference code's ``odeint(f, x0, tp_to_predict)``), so the first prediction equals it.
        vector_field: replaces the MLP; maps ``[..., 1 + D + augment_dim]`` (time first) to
            ``[..., D + augment_dim]`` (used to inject a known field, e.g. in tests).
    """

    def __init__(
        self,
        state_dim: int,
        *,
        hidden: Sequence[int] = (128, 128),
        augment_dim: int = 0,
        solver: str = "euler",
        rtol: float = 1e-3,
        atol: float = 1e-4,
        adjoint: bool = False,
        start: Start = "last_observed",
        vector_field: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if augment_dim < 0:
            raise ValueError(f"augment_dim must be >= 0, got {augment_dim}")
        if start not in get_args(Start):
            raise ValueError(f"start must be one of {get_args(Start)}, got {start!r}")
        self.start = start
        self.state_dim = int(state_dim)
        self.augment_dim = int(augment_dim)
        self.solver = check_solver(solver)
        self.rtol, self.atol, self.adjoint = float(rtol), float(atol), bool(adjoint)
        width = self.state_dim + self.augment_dim
        self.field = vector_field if vector_field is not None else mlp(1 + width, hidden, width)

    def _f(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        self.count_nfe()
        tt = t.to(x).expand(x.shape[0]).unsqueeze(-1)  # t: 0-d (shared grid) or [B]
        return self.field(torch.cat([tt, x], dim=-1))

    def forward(
        self, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
    ) -> torch.Tensor:
        ot, qt = check_inputs(obs_t, obs_x, query_t, self.state_dim)
        x0 = obs_x[:, -1, :]
        if self.augment_dim:
            x0 = torch.cat([x0, x0.new_zeros(x0.shape[0], self.augment_dim)], dim=-1)
        sol = odeint_grid(
            self._f,
            x0,
            ot[:, -1] if self.start == "last_observed" else qt[:, 0],
            qt,
            solver=self.solver,
            rtol=self.rtol,
            atol=self.atol,
            adjoint=self.adjoint,
            owner=self.field,
            count_nfe=self.count_nfe,
        )
        return sol[..., : self.state_dim]


@register_model("anode")
class ANODE(NODE):
    """Augmented Neural ODE (Dupont et al., 2019): NODE with one zero-augmented dimension.

    Paper size: 17,282 parameters for D = 1. Keyword arguments as :class:`NODE`.
    """

    def __init__(self, state_dim: int, *, augment_dim: int = 1, **kwargs: Any) -> None:
        if augment_dim < 1:
            raise ValueError(f"ANODE needs augment_dim >= 1, got {augment_dim}")
        super().__init__(state_dim, augment_dim=augment_dim, **kwargs)
