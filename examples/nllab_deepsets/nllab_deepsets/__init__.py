"""An example forecasting model from outside the platform, registered as ``deepsets``.

The observed points are encoded as a set (Zaheer et al., "Deep Sets", NeurIPS 2017): each
``(t_i, x_i)`` goes through one MLP and the mean of the results is the latent code ``z``; a
second MLP maps ``(z, t)`` to the state at any query time ``t``. No solver, no recurrence: the
whole model is batched tensor algebra, so the platform packs it (trains several seeds as one
vmapped model) like its own MLP-based models.
"""

from __future__ import annotations

import torch
from torch import nn

from nlmodels import ForecastModel, register_model
from nlmodels.base import batch_times

__all__ = ["DeepSets"]


def _mlp(n_in: int, width: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(n_in, width),
        nn.Tanh(),
        nn.Linear(width, width),
        nn.Tanh(),
        nn.Linear(width, n_out),
    )


@register_model("deepsets")
class DeepSets(ForecastModel):
    """Set encoder of the observed points and a time-conditioned decoder.

    Args:
        state_dim: D, the trajectory dimension.
        latent_dim: size of the set code ``z``.
        hidden: width of both MLPs (two hidden layers each).
    """

    def __init__(self, state_dim: int, *, latent_dim: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.state_dim = int(state_dim)
        self.encoder = _mlp(1 + self.state_dim, hidden, latent_dim)
        self.decoder = _mlp(latent_dim + 1, hidden, self.state_dim)

    def forward(
        self, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
    ) -> torch.Tensor:
        batch = obs_x.shape[0]
        t_obs = batch_times(obs_t, batch).unsqueeze(-1)  # [B, T_o, 1]
        t_q = batch_times(query_t, batch).unsqueeze(-1)  # [B, T_q, 1]
        z = self.encoder(torch.cat([t_obs, obs_x], dim=-1)).mean(dim=1)  # [B, latent]
        self.count_nfe(1)
        z = z.unsqueeze(1).expand(-1, t_q.shape[1], -1)
        return self.decoder(torch.cat([z, t_q], dim=-1))
