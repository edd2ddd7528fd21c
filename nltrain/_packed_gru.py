"""``nn.GRU`` and ``nn.GRUCell`` in plain tensor ops, which ``torch.func.vmap`` batches over a
pack's members (it has no batching rule for the fused RNN kernels); packed training swaps them in
(:func:`replace_gru_modules`). Same parameter names, so the modules' state dicts fit."""

from __future__ import annotations

from typing import TypeGuard

import torch
from torch import nn

__all__ = ["PlainGRU", "PlainGRUCell", "is_plain_gru", "replace_gru_modules"]


class PlainGRUCell(nn.Module):
    """``nn.GRUCell`` in plain tensor ops, in the order of ATen's CPU ``gru_cell``
    (aten/src/ATen/native/RNN.cpp): ``vmap`` has no batching rule for ``gru_cell`` and would
    run it member by member."""

    # registered in __init__: the cell's own parameters
    weight_ih: nn.Parameter
    weight_hh: nn.Parameter
    bias_ih: nn.Parameter
    bias_hh: nn.Parameter

    def __init__(self, cell: nn.GRUCell) -> None:
        super().__init__()
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            self.register_parameter(name, getattr(cell, name))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        i_r, i_z, i_n = nn.functional.linear(x, self.weight_ih, self.bias_ih).chunk(3, -1)
        h_r, h_z, h_n = nn.functional.linear(h, self.weight_hh, self.bias_hh).chunk(3, -1)
        reset = torch.sigmoid(h_r + i_r)
        update = torch.sigmoid(h_z + i_z)
        new = torch.tanh(i_n + h_n * reset)
        return (h - new) * update + new


class PlainGRU(nn.Module):
    """A multi-layer ``nn.GRU`` (unidirectional, no dropout or projection, zero initial state) in
    plain tensor ops, which ``vmap`` batches (it cannot batch the fused RNN kernels). Same
    parameter names, so a state dict of ``nn.GRU`` fits.

    The layers advance as one wavefront (as :mod:`nlmodels.accel.gru` does with its own
    backward): at step k layer l processes time k − l, so all layers take one matrix product
    and a few elementwise kernels per step, over T + L − 1 steps instead of L·T. The state row
    is ``[h_0 | … | h_{L−1}]``; the product gives every layer's hidden-side gates and (from the
    layer below) input-side gates at once, layer 0's input side is computed for all steps
    beforehand. Layers that have not started keep a zero state; a finished layer's later
    values reach no live layer."""

    def __init__(self, gru: nn.GRU) -> None:
        super().__init__()
        self.num_layers, self.hidden_size = gru.num_layers, gru.hidden_size
        self.batch_first = gru.batch_first
        for name, param in gru.named_parameters():
            self.register_parameter(name, param)

    def _weights(self, name: str) -> list[torch.Tensor]:
        return [getattr(self, f"{name}_l{layer}") for layer in range(self.num_layers)]

    def _block(self) -> torch.Tensor:
        """[L·H, 2·L·3H]: state rows → (hidden-side gates of every layer | input-side gates)."""
        n_layers, h = self.num_layers, self.hidden_size
        w_ih, w_hh = self._weights("weight_ih"), self._weights("weight_hh")
        zero = w_hh[0].new_zeros(h, 3 * h)
        rows = []
        for layer in range(n_layers):
            hidden = [w_hh[layer].T if k == layer else zero for k in range(n_layers)]
            inputs = [w_ih[k].T if k == layer + 1 else zero for k in range(n_layers)]
            rows.append(torch.cat(hidden + inputs, dim=1))
        return torch.cat(rows, dim=0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.batch_first:
            x = x.transpose(0, 1)
        batch, n_time = x.shape[:2]
        n_layers, h = self.num_layers, self.hidden_size
        n_steps = n_time + n_layers - 1
        w_ih, b_ih, b_hh = (
            self._weights("weight_ih"),
            self._weights("bias_ih"),
            self._weights("bias_hh"),
        )
        # What each step adds to the product: biases, and layer 0's input side (after the
        # last time point: its bias alone; layer 0 is finished then).
        first = nn.functional.linear(x, w_ih[0], b_ih[0])  # [B, T, 3H]
        first = torch.cat((first, b_ih[0].expand(batch, n_layers - 1, 3 * h)), dim=1)
        step_terms = torch.cat(
            (
                torch.cat(b_hh).expand(batch, n_steps, n_layers * 3 * h),
                first,
                *(b.expand(batch, n_steps, 3 * h) for b in b_ih[1:]),
            ),
            dim=-1,
        )
        # unbind: one backward node for all steps (indexing step k would materialise a
        # gradient of the whole tensor at every step)
        steps = step_terms.unbind(1)
        block = self._block()
        state = x.new_zeros(batch, n_layers * h)
        outs, finals = [], [state[:, :h]] * n_layers
        for k in range(n_steps):
            gates = torch.addmm(steps[k], state, block).view(batch, 2, n_layers, 3, h)
            hidden, inputs = gates[:, 0], gates[:, 1]
            rz = torch.sigmoid(inputs[:, :, :2] + hidden[:, :, :2])
            new = torch.tanh(torch.addcmul(inputs[:, :, 2], rz[:, :, 0], hidden[:, :, 2]))
            h_all = (state.view(batch, n_layers, h) - new) * rz[:, :, 1] + new
            if k < n_layers - 1:  # layers above k have not started
                h_all = torch.cat(
                    (h_all[:, : k + 1], h_all.new_zeros(batch, n_layers - k - 1, h)), 1
                )
            state = h_all.reshape(batch, n_layers * h)
            if k >= n_layers - 1:
                outs.append(h_all[:, -1])
            for layer in range(n_layers):
                if k == n_time - 1 + layer:
                    finals[layer] = h_all[:, layer]
        out = torch.stack(outs, dim=1)
        return (out if self.batch_first else out.transpose(0, 1)), torch.stack(finals)


def is_plain_gru(module: nn.Module) -> TypeGuard[nn.GRU]:
    return (
        type(module) is nn.GRU
        and module.bias
        and not module.bidirectional
        and not module.dropout
        and not module.proj_size
    )


def replace_gru_modules(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if type(child) is nn.GRUCell:
            setattr(module, name, PlainGRUCell(child))
        elif is_plain_gru(child):
            setattr(module, name, PlainGRU(child))
        else:
            replace_gru_modules(child)
