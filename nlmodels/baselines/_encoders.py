"""ODE-RNN encoder (Rubanova et al., 2019) shared by the Latent ODE and the Neural Flow models."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from nlmodels.baselines._mlp import mlp, stacked_linear, stacked_mlp

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
        return self._read(obs_t, obs_x, evolve, self.cell, self.head)

    def stacked(
        self,
        state: Mapping[str, torch.Tensor],
        prefix: str,
        obs_t: torch.Tensor,
        obs_x: torch.Tensor,
        evolve: Evolve,
    ) -> torch.Tensor:
        """:meth:`forward` of M copies at once, from their stacked tensors
        ``state[prefix + name]``: ``obs_x [M, B, T, D]`` → ``[M, B, out_dim]`` (``obs_t [B, T]``
        shared; ``evolve`` takes ``h [M, B, H]``)."""
        return self._read(
            obs_t,
            obs_x,
            evolve,
            _stacked_gru_cell(state, f"{prefix}cell."),
            stacked_mlp(self.head, state, f"{prefix}head."),
        )

    def _read(self, obs_t, obs_x, evolve, cell, head) -> torch.Tensor:
        # obs_x [..., T, D]: the loop reads along T; the leading dimensions are batch-like.
        h = obs_x.new_zeros(*obs_x.shape[:-2], self.hidden_dim)
        h = cell(obs_x[..., -1, :], h)
        for i in range(obs_x.shape[-2] - 2, -1, -1):  # a loop over time only, as any RNN
            h = evolve(h, obs_t[:, i] - obs_t[:, i + 1])
            h = cell(obs_x[..., i, :], h)
        return head(h)


def _stacked_gru_cell(
    state: Mapping[str, torch.Tensor], prefix: str
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """M copies of an ``nn.GRUCell`` at once, in plain tensor ops in the order of ATen's CPU
    ``gru_cell`` (aten/src/ATen/native/RNN.cpp)."""
    input_gates = stacked_linear(
        {"weight": state[f"{prefix}weight_ih"], "bias": state[f"{prefix}bias_ih"]}, ""
    )
    hidden_gates = stacked_linear(
        {"weight": state[f"{prefix}weight_hh"], "bias": state[f"{prefix}bias_hh"]}, ""
    )

    def cell(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        i_r, i_z, i_n = input_gates(x).chunk(3, -1)
        h_r, h_z, h_n = hidden_gates(h).chunk(3, -1)
        reset = torch.sigmoid(h_r + i_r)
        update = torch.sigmoid(h_z + i_z)
        new = torch.tanh(i_n + h_n * reset)
        return (h - new) * update + new

    return cell
