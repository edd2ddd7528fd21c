"""A stacked GRU returning only its final output, run as one wavefront with explicit backprop.

Neural Laplace's encoder needs the top layer's output at the last step alone. ``nn.GRU`` on the CPU
records ~10 autograd nodes per layer and step and runs the layers one after another. Here the L
layers advance together as a wavefront (at step k, layer l processes time k − l), so one step of
ALL layers is one matrix product with a block weight matrix and four elementwise kernels, over
T + L − 1 steps instead of L·T; backpropagation through time is written out by hand with the same
economy. The maths and parameters are exactly ``nn.GRU``'s (tested against it), so the module, its
state dict and its CUDA path (cuDNN) stay ``nn.GRU``.

GRU (Cho et al. 2014, PyTorch's convention), per layer:
    r = σ(W_ir x + b_ir + W_hr h + b_hr),  z = σ(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = n + z ⊙ (h − n).

The state of all layers is one row [h_0 | h_1 | ... | h_{L−1}] (width L·H). Pre-activation
columns are grouped by gate, then layer: [r_0..r_{L−1} | z_0.. | n^in_0.. | n^hid_0..] (width
4·L·H), so σ, tanh and the update act on all layers at once and the update's output IS the next
state row.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from nlmodels.accel import native
from nlmodels.accel._select import select

__all__ = ["gru_final_output"]

#: Steps per block of the backward pass (see _WavefrontGRU.backward).
_BACKWARD_BLOCK = 16


def _block_weights(weights, n_layers: int, units: int, n_inputs: int) -> torch.Tensor:
    """The block matrix M [L·H + I + 1, 4·L·H] acting on the row [h_0 .. h_{L−1} | x | 1].

    Rows of layer l's state feed layer l's hidden side and layer l+1's input side; the x rows
    carry the first layer's input weights and the constant row all biases (input and hidden biases
    of r and z simply add).
    """
    h, big = units, n_layers * units
    m = weights[0].new_zeros(big + n_inputs + 1, 4 * big)
    ones = big + n_inputs
    for layer in range(n_layers):
        w_ih, w_hh, b_ih, b_hh = weights[4 * layer : 4 * layer + 4]
        rows_h = slice(layer * h, (layer + 1) * h)
        rows_x = slice((layer - 1) * h, layer * h) if layer else slice(big, big + n_inputs)
        cols = [slice(g * big + layer * h, g * big + (layer + 1) * h) for g in range(4)]
        for gate in range(3):  # r, z, n^in: the input side
            m[rows_x, cols[gate]] = w_ih[gate * h : (gate + 1) * h].T
            m[ones, cols[gate]] = b_ih[gate * h : (gate + 1) * h]
        for gate, col in ((0, 0), (1, 1), (2, 3)):  # r, z, n^hid: the hidden side
            m[rows_h, cols[col]] = w_hh[gate * h : (gate + 1) * h].T
            m[ones, cols[col]] += b_hh[gate * h : (gate + 1) * h]
    return m


class _WavefrontGRU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n_layers: int, *weights):
        batch, n_time, n_inputs = x.shape
        units = weights[1].shape[1]
        big = n_layers * units
        n_steps = n_time + n_layers - 1
        m = _block_weights(weights, n_layers, units, n_inputs)
        # rows[k] = [states after step k−1 | x_k | 1]; x and the constant are known in advance.
        rows = x.new_zeros(n_steps + 1, batch, big + n_inputs + 1)
        rows[:n_time, :, big : big + n_inputs] = x.transpose(0, 1)
        rows[..., -1] = 1.0
        # per step: σ(r, z) | n^in pre-activation | n^hid (kept for the backward) ...
        gates = x.new_empty(n_steps, batch, 4 * big)
        new_n = x.new_empty(n_steps, batch, big)  # ... and n
        for k in range(n_steps):
            a = torch.mm(rows[k], m, out=gates[k])
            rz = a[:, : 2 * big].sigmoid_()
            n = torch.addcmul(a[:, 2 * big : 3 * big], rz[:, :big], a[:, 3 * big :], out=new_n[k])
            torch.lerp(n.tanh_(), rows[k, :, :big], rz[:, big:], out=rows[k + 1, :, :big])
            if k < n_layers - 1:  # layers above k have not started: keep their zero state
                rows[k + 1, :, (k + 1) * units : big] = 0.0
        ctx.shape = (n_layers, units, n_time)
        ctx.save_for_backward(x, m, rows, gates, new_n)
        return rows[-1, :, (n_layers - 1) * units : big].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x, m, rows, gates, new_n = ctx.saved_tensors
        n_layers, units, n_time = ctx.shape
        big = n_layers * units
        n_steps, batch = gates.shape[:2]
        m_state_t = m[:big].T.contiguous()  # only the state rows carry gradient backwards
        g_m = torch.zeros_like(m)
        g_x = x.new_zeros(n_time, batch, x.shape[-1]) if ctx.needs_input_grad[0] else None
        dh = x.new_zeros(batch, big)
        dh[:, (n_layers - 1) * units :] = grad_out
        # Steps are taken in blocks: the factors that do not depend on the recurrence, and the
        # weight-gradient products, are computed once per block (cache-sized, few kernels); only
        # five small kernels per step remain in the sequential loop.
        for hi in range(n_steps, 0, -_BACKWARD_BLOCK):
            lo = max(0, hi - _BACKWARD_BLOCK)
            g = gates[lo:hi]
            r, z, n, n_hid = g[..., :big], g[..., big : 2 * big], new_n[lo:hi], g[..., 3 * big :]
            # n: ∂h'/∂n = 1 − z, tanh' = 1 − n²;  r: ∂n_pre/∂r = n^hid, σ' = r(1 − r);
            # z: ∂h'/∂z = h − n, σ' = z(1 − z)
            f_n = (1.0 - z).mul_(1.0 - n.square())
            f_r = torch.addcmul(r, r, r, value=-1.0).mul_(n_hid)
            f_z = torch.addcmul(z, z, z, value=-1.0).mul_(rows[lo:hi, :, :big] - n)
            d_pre = x.new_empty(hi - lo, batch, 4 * big)
            d_r, d_z = d_pre[..., :big], d_pre[..., big : 2 * big]
            d_nin, d_nhid = d_pre[..., 2 * big : 3 * big], d_pre[..., 3 * big :]
            for k in range(hi - 1, lo - 1, -1):
                i = k - lo
                if k < n_layers - 1:  # those states were reset to constants in the forward
                    dh[:, (k + 1) * units :] = 0.0
                torch.mul(dh, f_n[i], out=d_nin[i])
                torch.mul(d_nin[i], f_r[i], out=d_r[i])
                torch.mul(dh, f_z[i], out=d_z[i])
                torch.mul(d_nin[i], r[i], out=d_nhid[i])
                dh = torch.addmm(dh * z[i], d_pre[i], m_state_t)
            g_m.addmm_(rows[lo:hi].flatten(0, 1).T, d_pre.flatten(0, 1))
            if g_x is not None and lo < n_time:
                top = min(hi, n_time)
                g_x[lo:top] = d_pre[: top - lo] @ m[big : big + x.shape[-1]].T
        # Read the weight gradients back out of the block layout (the inverse of _block_weights).
        grads: list[torch.Tensor] = []
        h, n_in = units, x.shape[-1]
        ones = big + n_in
        for layer in range(n_layers):
            rows_h = slice(layer * h, (layer + 1) * h)
            rows_x = slice((layer - 1) * h, layer * h) if layer else slice(big, big + n_in)
            cols = [slice(g * big + layer * h, g * big + (layer + 1) * h) for g in range(4)]
            grads += [
                torch.cat([g_m[rows_x, cols[g]].T for g in range(3)]),  # W_ih
                torch.cat([g_m[rows_h, cols[g]].T for g in (0, 1, 3)]),  # W_hh
                torch.cat([g_m[ones, cols[g]] for g in range(3)]),  # b_ih
                torch.cat([g_m[ones, cols[g]] for g in (0, 1, 3)]),  # b_hh
            ]
        if g_x is not None:
            g_x = g_x.transpose(0, 1)
        return (g_x, None, *grads)


class _NativeGRU(torch.autograd.Function):
    """The same GRU through the fused C kernels (:mod:`nlmodels.accel.native`), float64 on the CPU.

    The C forward runs the whole recurrence (layer by layer, gate maths fused into each step's
    matrix products) and keeps r, z, n, W_hn h + b_hn and every state; the C backward runs BPTT
    and accumulates every parameter gradient step by step while the step's gradients are in
    cache.
    """

    @staticmethod
    def forward(ctx, x, n_layers: int, *weights):
        batch, n_time, n_inputs = x.shape
        units = weights[1].shape[1]
        layers = range(n_layers)
        xs = x.permute(2, 1, 0).contiguous()  # [I, T, B]
        w_ih = torch.cat([weights[4 * layer].reshape(-1) for layer in layers])
        w_hh, b_ih, b_hh = (
            torch.stack([weights[4 * layer + k] for layer in layers]).contiguous()
            for k in (1, 2, 3)
        )
        states = x.new_empty(n_layers, units, n_time + 1, batch)
        gates = x.new_empty(n_layers, 4 * units, n_time, batch)
        status = native.call(
            "nl_gru_forward", n_time, batch, n_inputs, units, n_layers,
            xs, w_ih, w_hh, b_ih, b_hh, states, gates,
        )  # fmt: skip
        if status:
            raise MemoryError("native GRU forward: out of memory")
        ctx.units = units
        ctx.save_for_backward(xs, w_ih, w_hh, states, gates)
        return states[-1, :, -1].T.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        xs, w_ih, w_hh, states, gates = ctx.saved_tensors
        n_layers, units = states.shape[0], ctx.units
        n_inputs, n_time, batch = xs.shape
        g_w_ih, g_w_hh = torch.empty_like(w_ih), torch.empty_like(w_hh)
        g_b_ih, g_b_hh = xs.new_empty(n_layers, 3 * units), xs.new_empty(n_layers, 3 * units)
        d_x = xs.new_empty(n_inputs, n_time, batch) if ctx.needs_input_grad[0] else None
        grad_top = grad_out.T.contiguous()
        status = native.call(
            "nl_gru_backward", n_time, batch, n_inputs, units, n_layers,
            xs, w_ih, w_hh, states, gates, grad_top, g_w_ih, g_w_hh, g_b_ih, g_b_hh, d_x,
        )  # fmt: skip
        if status:
            raise MemoryError("native GRU backward: out of memory")
        grads: list[torch.Tensor] = []
        offset = 0
        for layer in range(n_layers):
            n_in = n_inputs if layer == 0 else units
            size = 3 * units * n_in
            grads += [
                g_w_ih[offset : offset + size].view(3 * units, n_in),
                g_w_hh[layer],
                g_b_ih[layer],
                g_b_hh[layer],
            ]
            offset += size
        g_x = None if d_x is None else d_x.permute(2, 1, 0)
        return (g_x, None, *grads)


def gru_final_output(x: torch.Tensor, gru: torch.nn.GRU) -> torch.Tensor:
    """``gru(x)[0][:, -1]`` for a batch-first, unidirectional, dropout-free ``nn.GRU`` with zero
    initial state: the last output of the top layer, ``[B, H]``. Off the CPU or on the plain
    path (``torch.compile``, ``vmap``, :func:`~nlmodels.accel.plain_formulas`), ``gru`` itself;
    on the CPU the native GRU or the torch wavefront (see :func:`select`)."""
    if x.device.type != "cpu" or select(x, *gru.parameters()) == "plain":
        return gru(x)[0][:, -1]
    if not gru.batch_first or gru.bidirectional or gru.dropout or gru.proj_size:
        raise ValueError("gru_final_output needs a batch-first, unidirectional GRU without dropout")
    weights = []
    for layer in range(gru.num_layers):
        weights += [
            getattr(gru, f"{name}_l{layer}")
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ]
    if select(x, *weights) == "native":
        return _NativeGRU.apply(x, gru.num_layers, *weights)
    return _WavefrontGRU.apply(x, gru.num_layers, *weights)
