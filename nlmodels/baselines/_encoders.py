"""ODE-RNN encoder (Rubanova et al., 2019) shared by the Latent ODE and the Neural Flow models."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from nlmodels.baselines._mlp import mlp

__all__ = ["ODERNNEncoder"]

#: ``evolve(h, dt)``: carry the hidden state ``h [B, H]`` across a time step ``dt [B]``.
Evolve = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ODERNNEncoder(nn.Module):
    """GRU over the observations, run backwards in time, whose hidden state evolves between them.

    Following Rubanova et al. (2019) the sequence is read from the last observation to the first;
    between observations the hidden state is carried across the (negative) time step by
    ``evolve`` — an ODE solve for the Latent ODE, a flow for Neural Flows (Biloš et al., 2021).
    The result summarises the trajectory at its first observed time; ``head`` maps it to the
    encoder output (posterior parameters or the latent initial state).
    """

    def __init__(
        self, input_dim: int, hidden_dim: int, out_dim: int, head_hidden: Sequence[int] = ()
    ) -> None:
        super().__init__()
        self.hidden_dim = int(hidden_dim)
        self.cell = nn.GRUCell(int(input_dim), self.hidden_dim)
        self.head = mlp(self.hidden_dim, head_hidden, out_dim)

    def forward(self, obs_t: torch.Tensor, obs_x: torch.Tensor, evolve: Evolve) -> torch.Tensor:
        """``obs_t [B, T]``, ``obs_x [B, T, D]`` → ``[B, out_dim]`` (vectorised over the batch)."""
        h = obs_x.new_zeros(obs_x.shape[0], self.hidden_dim)
        h = self.cell(obs_x[:, -1], h)
        for i in range(obs_x.shape[1] - 2, -1, -1):  # a loop over time only, as any RNN
            h = evolve(h, obs_t[:, i] - obs_t[:, i + 1])
            h = self.cell(obs_x[:, i], h)
        return self.head(h)
