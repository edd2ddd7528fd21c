"""A multi-layer GRU that returns only its final output, with hand-written backpropagation.

Neural Laplace's encoder needs the top layer's output at the last step alone. ``nn.GRU`` on the CPU
records ~10 autograd nodes per layer and step; this function keeps the same maths (PyTorch's gate
layout and equations, the same parameters) but runs the recurrences as a few in-place kernels per
step, hoists everything that does not depend on the recurrence (input projections, gate derivatives,
weight gradients) out of the time loop as single batched matrix products, and back-propagates
through time explicitly. Used on the CPU; ``nn.GRU`` (cuDNN) serves CUDA.

GRU (Cho et al. 2014, PyTorch convention):
    r = σ(W_ir x + b_ir + W_hr h + b_hr),  z = σ(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = n + z ⊙ (h − n).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["gru_final_output"]


def _layer_forward(inputs: torch.Tensor, w_ih, w_hh, b_ih, b_hh):
    """One layer over time-major ``inputs`` [T, B, I]; returns states [T+1, B, H] and saved gates."""
    n_time, batch = inputs.shape[:2]
    units = w_hh.shape[1]
    gi = torch.addmm(b_ih, inputs.flatten(0, 1), w_ih.T).view(n_time, batch, 3 * units)
    states = inputs.new_zeros(n_time + 1, batch, units)
    rz = inputs.new_empty(n_time, batch, 2 * units)
    n = inputs.new_empty(n_time, batch, units)
    ghn = inputs.new_empty(n_time, batch, units)
    w_hh_t = w_hh.T
    for t in range(n_time):
        gh = torch.addmm(b_hh, states[t], w_hh_t)
        torch.sigmoid(gi[t, :, : 2 * units] + gh[:, : 2 * units], out=rz[t])
        ghn[t] = gh[:, 2 * units :]
        torch.tanh(torch.addcmul(gi[t, :, 2 * units :], rz[t, :, :units], ghn[t]), out=n[t])
        torch.lerp(n[t], states[t], rz[t, :, units:], out=states[t + 1])
    return states, rz, n, ghn


def _layer_backward(d_out: torch.Tensor, last_only: bool, saved, inputs, w_ih, w_hh, need_input):
    """Back-propagate one layer; ``d_out`` is dL/dh_t [T, B, H] (or [B, H] for the last step only)."""
    states, rz, n, ghn = saved
    n_time, batch, units = n.shape
    z = rz[..., units:]
    # Everything that does not depend on the backward recurrence, for all steps at once.
    sig_grad = rz * (1.0 - rz)  # σ' for r and z
    dn_factor = (1.0 - z) * (1.0 - n.square())  # ∂h'/∂n · tanh'
    h_minus_n = states[:-1] - n
    d_gi = inputs.new_empty(n_time, batch, 3 * units)
    d_ghn = inputs.new_empty(n_time, batch, units)
    w_hh_rz, w_hh_n = w_hh[: 2 * units], w_hh[2 * units :]
    dh = d_out.clone() if last_only else torch.zeros_like(d_out[0])
    for t in range(n_time - 1, -1, -1):
        if not last_only:
            dh += d_out[t]
        dn_pre = torch.mul(dh, dn_factor[t], out=d_gi[t, :, 2 * units :])
        torch.mul(dn_pre * ghn[t], sig_grad[t, :, :units], out=d_gi[t, :, :units])
        torch.mul(dh * h_minus_n[t], sig_grad[t, :, units:], out=d_gi[t, :, units : 2 * units])
        torch.mul(dn_pre, rz[t, :, :units], out=d_ghn[t])
        dh = torch.addmm(dh * z[t], d_gi[t, :, : 2 * units], w_hh_rz)
        dh.addmm_(d_ghn[t], w_hh_n)
    d_gh = torch.cat((d_gi[..., : 2 * units], d_ghn), dim=-1).flatten(0, 1)
    d_gi_flat = d_gi.flatten(0, 1)
    grads = (
        d_gi_flat.T @ inputs.flatten(0, 1),  # W_ih
        d_gh.T @ states[:-1].flatten(0, 1),  # W_hh
        d_gi_flat.sum(0),  # b_ih
        d_gh.sum(0),  # b_hh
    )
    d_inputs = (d_gi @ w_ih) if need_input else None
    return d_inputs, grads


class _GRUFinal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n_layers: int, *weights):  # type: ignore[override]
        inputs = x.transpose(0, 1).contiguous()  # time-major [T, B, I]
        layer_inputs, saved = [], []
        for layer in range(n_layers):
            w_ih, w_hh, b_ih, b_hh = weights[4 * layer : 4 * layer + 4]
            layer_inputs.append(inputs)
            states, rz, n, ghn = _layer_forward(inputs, w_ih, w_hh, b_ih, b_hh)
            saved.append((states, rz, n, ghn))
            inputs = states[1:]
        ctx.n_layers = n_layers
        ctx.layer_inputs = layer_inputs
        ctx.saved_layers = saved
        ctx.save_for_backward(*weights)
        return inputs[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_final):  # type: ignore[override]
        weights = ctx.saved_tensors
        grads: list[torch.Tensor | None] = [None] * len(weights)
        d_out, last_only = grad_final, True
        d_x = None
        for layer in range(ctx.n_layers - 1, -1, -1):
            w_ih, w_hh = weights[4 * layer], weights[4 * layer + 1]
            need_input = layer > 0 or ctx.needs_input_grad[0]
            d_in, layer_grads = _layer_backward(
                d_out, last_only, ctx.saved_layers[layer], ctx.layer_inputs[layer], w_ih, w_hh,
                need_input,
            )
            grads[4 * layer : 4 * layer + 4] = layer_grads
            d_out, last_only = d_in, False
            d_x = d_in
        if d_x is not None and ctx.needs_input_grad[0]:
            d_x = d_x.transpose(0, 1)
        else:
            d_x = None
        return (d_x, None, *grads)


def gru_final_output(x: torch.Tensor, gru: torch.nn.GRU) -> torch.Tensor:
    """``gru(x)[0][:, -1]`` for a batch-first, unidirectional, dropout-free ``nn.GRU`` with zero
    initial state, computed with explicit backpropagation through time."""
    weights = []
    for layer in range(gru.num_layers):
        weights += [getattr(gru, f"{name}_l{layer}") for name in
                    ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    return _GRUFinal.apply(x, gru.num_layers, *weights)
