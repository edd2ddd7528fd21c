"""g's last two layers, the Riemann-sphere output map and a linear ILT as one autograd function.

For a linear ILT, x(t) = Σ_q Re(w_q(t) F_q) with weights w that depend on the query times alone.
The map from g's output layer to x (tanh scalings, the stereographic point v(θ, φ), the weighted
sum) is fused with g's last two layers into one autograd function whose backward is a
hand-written back-propagation in real arithmetic, from per-element derivatives saved by the
forward. The batch is processed in chunks of trajectories so temporaries stay cache-sized.
Elementwise steps run in the C kernels of :mod:`nlmodels.accel.native` (float64 on the CPU) or
as their torch twins here; the dense products are torch GEMMs on both paths. Under the portable
CPU numerics (:mod:`nlmodels.accel.portable`, whose products are the kernels' own), a chunk runs
as one kernel call each way (``nl_decoder_forward``/``nl_decoder_backward``: no Python between
its steps) that takes it in slices of a few trajectories, so that a step's output can still be in
cache for the next: the same operations, element by element in the same order, so the same bits.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from nlmodels.accel import native, portable
from nlmodels.accel._select import select

__all__ = ["fused_sphere_decode"]

# Output elements per chunk of the fused decoder (~1 MB of float64): temporaries stay cache-sized.
_CHUNK_ELEMENTS = 1 << 17
# Rows (trajectory × time) per slice of a chunk in the sliced kernels: a slice's layers (~3 KB a
# row) stay in a core's L2 cache between steps. Each slice but the last holds a multiple of
# _SLICE_LANES rows (its output bias's column sums are kept in vector lanes across slices).
_SLICE_ROWS = 512
_SLICE_LANES = 8


def slice_trajectories(n_time: int, rows: int = _SLICE_ROWS) -> int:
    """Trajectories per slice of the sliced decoder kernels for ``n_time`` times: about ``rows``
    rows, a whole multiple of the lanes (the slicing never changes a bit, only the speed)."""
    step = _SLICE_LANES // math.gcd(n_time, _SLICE_LANES)
    return max(step, rows // n_time // step * step)


def _rows(t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Rows lo:hi of a per-trajectory tensor, or the tensor itself when shared (leading dim 1)."""
    return t if t.shape[0] == 1 else t[lo:hi]


class _FusedSphereDecoder(torch.autograd.Function):
    """g's last two layers, the Riemann-sphere output map and a linear ILT, fused and chunked.

    Computes, for trajectories b, times t, dimensions d:
        h1 = tanh(per_time[t] + per_traj[b]),  h2 = tanh(W2 h1 + b2),  o = W3 h2 + b3,
        θ = π tanh(o_θ),  φ = φ_min + Δφ (tanh(o_φ) + 1)/2,  F = tan(φ/2 + π/4) e^{iθ},
        x[b, t, d] = Σ_q Re(w[t, q] F[b, t, d, q]) = Σ_q r |w| cos(θ + arg w)
    in real arithmetic (dr/dφ = (1 + r²)/2). The work is split into chunks of trajectories so
    temporaries stay cache-resident; the forward keeps the per-element derivatives of x with
    respect to o (each x depends on its own Q outputs only) and the backward is a hand-written
    back-propagation through the two dense layers. The dense products are torch GEMMs; everything
    elementwise runs in the fused C kernels of :mod:`nlmodels.accel.native` where they apply
    (float64 on the CPU), else as the torch twin below.

    Shapes: per_time [1 or B, T, H], per_traj [B, H], w_abs/w_arg [1 or B, T, 1, Q].
    """

    @staticmethod
    def forward(
        ctx,
        per_time,
        per_traj,
        w2,
        b2,
        w3,
        b3,
        w_abs,
        w_arg,
        state_dim: int,
        phi_min: float,
        phi_span: float,
    ):
        batch, n_time = per_traj.shape[0], per_time.shape[1]
        phi_centre = 0.5 * phi_min + 0.25 * phi_span + math.pi / 4  # φ/2 + π/4 at tanh = 0
        chunk = max(1, _CHUNK_ELEMENTS // (n_time * state_dim * w_abs.shape[-1]))
        x = per_traj.new_empty(batch, n_time, state_dim)
        ctx.native = select(per_time, per_traj, w2, b2, w3, b3, w_abs, w_arg) == "native"
        ctx.sliced = ctx.native and portable.installed()
        if ctx.native:  # the kernels take the ILT weights as [(B,) Q, T]
            w_abs, w_arg = (w[:, :, 0].transpose(1, 2).contiguous() for w in (w_abs, w_arg))
        args = (per_time, per_traj, w2, b2, w3, b3, w_abs, w_arg, state_dim, phi_span, phi_centre)
        chunk_forward = (
            _sliced_chunk_forward
            if ctx.sliced
            else _native_chunk_forward
            if ctx.native
            else _torch_chunk_forward
        )
        ctx.saved_chunks = [
            chunk_forward(lo, min(lo + chunk, batch), x, *args) for lo in range(0, batch, chunk)
        ]
        ctx.chunk = chunk
        ctx.save_for_backward(per_time, w2, w3)
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_x):
        per_time, w2, w3 = ctx.saved_tensors
        grad_x = grad_x.contiguous()
        g_time = torch.zeros_like(per_time)
        g_traj = per_time.new_zeros(grad_x.shape[0], per_time.shape[-1])
        g_w2, g_b2 = torch.zeros_like(w2), w2.new_zeros(w2.shape[0])
        g_w3, g_b3 = torch.zeros_like(w3), w3.new_zeros(w3.shape[0])
        chunk_backward = _NativeChunkBackward if ctx.native else _TorchChunkBackward
        for i, (h1, h2, d_out) in enumerate(ctx.saved_chunks):
            lo = i * ctx.chunk
            hi = lo + h1.shape[0] // per_time.shape[1]
            if ctx.sliced:
                grads = (g_time, g_traj, g_w2, g_b2, g_w3, g_b3)
                _sliced_chunk_backward(lo, hi, per_time, w2, w3, h1, h2, d_out, grad_x, *grads)
                continue
            g_out = chunk_backward.output(d_out, grad_x[lo:hi], g_b3)  # [n·T, 2DQ]
            g_w3.addmm_(g_out.T, h2)
            g_z2 = chunk_backward.tanh(g_out @ w3, h2, g_b2)
            g_w2.addmm_(g_z2.T, h1)
            chunk_backward.first(g_z2 @ w2, h1, lo, hi, g_time, g_traj)
        return g_time, g_traj, g_w2, g_b2, g_w3, g_b3, None, None, None, None, None


def _torch_chunk_forward(
    lo, hi, x, per_time, per_traj, w2, b2, w3, b3, w_abs, w_arg, state_dim, phi_span, phi_centre
):
    """Trajectories lo:hi of _FusedSphereDecoder's forward in torch ops; returns what the
    backward needs: h1, h2 and ∂x/∂o as ``[n·T, 2DQ]``."""
    n, n_time, units = hi - lo, per_time.shape[1], w2.shape[0]
    h1 = (_rows(per_time, lo, hi) + per_traj[lo:hi, None, :]).tanh_().view(-1, units)
    # mm + in-place bias: addmm's broadcast copy of the bias measured slower
    h2 = torch.mm(h1, w2.T).add_(b2).tanh_()
    # `out` holds tanh of the output layer, then (in place) ∂x/∂(output layer).
    out = torch.mm(h2, w3.T).add_(b3).tanh_().view(n, n_time, 2, state_dim, -1)
    ta, tb = out[:, :, 0], out[:, :, 1]
    amp = _rows(w_abs, lo, hi)
    angle = torch.add(_rows(w_arg, lo, hi), ta, alpha=math.pi)  # θ + arg w
    cos_a, sin_a = torch.cos(angle), angle.sin_()
    radius = tb.mul(0.25 * phi_span).add_(phi_centre).tan_()
    scaled = radius * amp  # r |w|
    torch.linalg.vecdot(scaled, cos_a, out=x[lo:hi])  # Σ_q r |w| cos(θ + arg w)
    # ∂x/∂o_θ = −r |w| sin(θ + arg w) · π (1 − tanh²)
    ta.square_().sub_(1.0).mul_(sin_a).mul_(scaled).mul_(math.pi)
    # ∂x/∂o_φ = |w| cos(θ + arg w) · (1 + r²)/2 · Δφ/2 (1 − tanh²)
    tb.square_().mul_(-0.25 * phi_span).add_(0.25 * phi_span).mul_(cos_a).mul_(amp)
    tb.mul_(radius.square_().add_(1.0))
    return h1, h2, out.view(n * n_time, -1)


def _native_chunk_forward(
    lo, hi, x, per_time, per_traj, w2, b2, w3, b3, w_abs, w_arg, state_dim, phi_span, phi_centre
):
    """The same as :func:`_torch_chunk_forward` through the C kernels (one pass per layer); the
    output layer is computed transposed, ``[2DQ, n·T]``, so the kernel runs along time, and that
    is what it returns as ∂x/∂o. ``w_abs``/``w_arg`` are ``[(B,) Q, T]``."""
    call = native.call
    n, n_time, units = hi - lo, per_time.shape[1], w2.shape[0]
    per_row_time, per_row_w = per_time.shape[0] != 1, w_abs.shape[0] != 1
    h1 = per_traj.new_empty(n * n_time, units)
    call(
        "nl_first_hidden", n, n_time, units, int(per_row_time),
        _rows(per_time, lo, hi).contiguous(), per_traj[lo:hi].contiguous(), h1,
    )  # fmt: skip
    h2 = torch.mm(h1, w2.T)
    call("nl_bias_tanh", h2.shape[0], units, h2, b2.contiguous())
    out_t = torch.mm(w3, h2.T)
    call(
        "nl_sphere_out_forward", n, n_time, state_dim, w_abs.shape[1], int(per_row_w), out_t,
        b3.contiguous(), _rows(w_abs, lo, hi), _rows(w_arg, lo, hi), 0.25 * phi_span,
        phi_centre, x[lo:hi], x.new_empty(n_time),
    )  # fmt: skip
    return h1, h2, out_t


def _sliced_chunk_forward(
    lo, hi, x, per_time, per_traj, w2, b2, w3, b3, w_abs, w_arg, state_dim, phi_span, phi_centre
):
    """:func:`_native_chunk_forward` in one kernel call, slice by slice (the same bits); ∂x/∂o
    is returned laid out by slice (see ``nl_decoder_forward``)."""
    n, n_time, units = hi - lo, per_time.shape[1], w2.shape[0]
    h1, h2 = (per_traj.new_empty(n * n_time, units) for _ in range(2))
    out_t = per_traj.new_empty(n * n_time * w3.shape[0])
    status = native.call(
        "nl_decoder_forward", n, n_time, units, state_dim, w_abs.shape[1],
        slice_trajectories(n_time), int(per_time.shape[0] != 1),
        _rows(per_time, lo, hi).contiguous(), per_traj[lo:hi].contiguous(), w2.contiguous(),
        b2.contiguous(), w3.contiguous(), b3.contiguous(), int(w_abs.shape[0] != 1),
        _rows(w_abs, lo, hi), _rows(w_arg, lo, hi), 0.25 * phi_span, phi_centre, h1, h2, out_t,
        x[lo:hi], x.new_empty(n_time),
    )  # fmt: skip
    _check_status("nl_decoder_forward", status)
    return h1, h2, out_t


def _sliced_chunk_backward(
    lo, hi, per_time, w2, w3, h1, h2, d_out, grad_x, g_time, g_traj, g_w2, g_b2, g_w3, g_b3
):
    """The backward of trajectories lo:hi (:func:`_sliced_chunk_forward`) in one kernel call,
    its gradients accumulated as the chunk steps below accumulate them (the same bits)."""
    n_time, units, state_dim = per_time.shape[1], w2.shape[0], grad_x.shape[-1]
    per_row = per_time.shape[0] != 1
    status = native.call(
        "nl_decoder_backward", hi - lo, n_time, units, state_dim,
        w3.shape[0] // (2 * state_dim), slice_trajectories(n_time), int(per_row),
        w2.contiguous(), w3.contiguous(), h1, h2, d_out, grad_x[lo:hi],
        g_time[lo:hi] if per_row else g_time, g_traj[lo:hi], g_w2, g_b2, g_w3, g_b3,
    )  # fmt: skip
    _check_status("nl_decoder_backward", status)


def _check_status(name: str, status: int | None) -> None:
    if status == 1:
        raise MemoryError(f"{name}: no memory for its scratch")
    if status:
        raise ValueError(f"{name}: a slice size the kernel cannot take (status {status})")


class _TorchChunkBackward:
    """The elementwise steps of _FusedSphereDecoder's backward, in torch ops."""

    @staticmethod
    def output(d_out, grad_x, g_b3):
        """∂L/∂o = ∂x/∂o · ∂L/∂x, and its column sums into g_b3."""
        rows, state_dim = d_out.shape[0], grad_x.shape[-1]
        g_out = d_out.view(rows, 2, state_dim, -1) * grad_x.reshape(rows, 1, state_dim, 1)
        g_out = g_out.view(rows, -1)
        g_b3.add_(g_out.sum(0))
        return g_out

    @staticmethod
    def tanh(g, h, g_bias):
        """Through tanh (from its output h), in place, and the column sums into g_bias."""
        g.mul_(torch.addcmul(torch.ones_like(h), h, h, value=-1.0))
        g_bias.add_(g.sum(0))
        return g

    @staticmethod
    def first(g, h1, lo, hi, g_time, g_traj):
        """Through the first layer's tanh; the sums over trajectories / times."""
        g.mul_(torch.addcmul(torch.ones_like(h1), h1, h1, value=-1.0))
        g = g.view(hi - lo, -1, g.shape[-1])
        if g_time.shape[0] == 1:
            g_time[0].add_(g.sum(0))
        else:
            g_time[lo:hi] = g
        torch.sum(g, dim=1, out=g_traj[lo:hi])


class _NativeChunkBackward:
    """The same as :class:`_TorchChunkBackward` through the C kernels."""

    @staticmethod
    def output(d_out_t, grad_x, g_b3):
        rows, state_dim = d_out_t.shape[1], grad_x.shape[-1]
        g_out_t = torch.empty_like(d_out_t)
        native.call(
            "nl_sphere_out_backward", rows, state_dim, d_out_t.shape[0] // (2 * state_dim),
            d_out_t, grad_x.reshape(rows, state_dim), g_out_t, g_b3,
            d_out_t.new_empty(state_dim * rows),
        )  # fmt: skip
        return g_out_t.T

    @staticmethod
    def tanh(g, h, g_bias):
        native.call("nl_tanh_backward", g.shape[0], g.shape[1], g, h, g_bias)
        return g

    @staticmethod
    def first(g, h1, lo, hi, g_time, g_traj):
        per_row = g_time.shape[0] != 1
        native.call(
            "nl_first_hidden_backward", hi - lo, g_time.shape[1], g.shape[1], int(per_row), g,
            h1, g_time[lo:hi] if per_row else g_time, g_traj[lo:hi],
        )  # fmt: skip


def fused_sphere_decode(
    per_time: torch.Tensor,
    per_traj: torch.Tensor,
    hidden: torch.nn.Linear,
    out: torch.nn.Linear,
    weights: torch.Tensor,
    state_dim: int,
    phi_min: float,
    phi_span: float,
) -> torch.Tensor:
    """x = Σ_q Re(w_q F_q) ``[B, T, D]`` with F on the Riemann sphere, from g's first layer.

    ``per_time`` ``[(B,) T, H]`` and ``per_traj`` ``[B, H]`` are the two parts of g's first-layer
    pre-activation, ``hidden`` and ``out`` g's last two layers, ``weights`` the linear ILT's
    complex weights ``[(B,) T, Q]``, ``phi_min``/``phi_span`` the range of φ.
    """
    if per_time.dim() == 2:
        per_time = per_time.unsqueeze(0)
    w = weights.unsqueeze(-2)
    if w.dim() == 3:
        w = w.unsqueeze(0)
    return _FusedSphereDecoder.apply(
        per_time,
        per_traj,
        hidden.weight,
        hidden.bias,
        out.weight,
        out.bias,
        w.abs(),
        w.angle(),
        state_dim,
        phi_min,
        phi_span,
    )
