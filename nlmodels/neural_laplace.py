"""Neural Laplace (Holt, Qian & van der Schaar, ICML 2022).

x(t) = ILT{F(p, ·)}(t): an encoder h maps the observed prefix to p ∈ R^K, a network g gives the
Laplace representation F(p, s) in Riemann-sphere coordinates, and an inverse Laplace transform turns
F at the algorithm's query points s_1..s_Q(t) into x(t).

Architecture as in the reference implementation (spec ``method.md``):

* encoder: the observed sequence reversed in time through a 2-layer GRU (21 units), its last output
  through a Xavier-initialised Linear to K;
* g: one evaluation per time point on all Q query points jointly, input
  ``[θ_1..θ_Q, φ_1..φ_Q, p_1..p_K]``, MLP ``2Q+K → H → H → 2QD`` with tanh, output rows
  ``θ = π·tanh(·)`` (first D) and ``φ = φ_min + (φ_max − φ_min)(tanh(·)+1)/2`` (next D);
* ILT: any of :mod:`nlmodels.ilt`.

Speed (the maths are unchanged):

* the first layer of g is split into the part that depends on p (once per trajectory) and the
  part that depends on the query points (once per time point), then broadcast-added;
* for linear ILTs, x(t) = Σ_q Re(w_q(t) F_q) with precomputed weights w; the map from the network
  output to x (tanh scalings, v(θ, φ), the weighted sum) is one fused autograd function whose
  backward is two multiplications with Jacobians saved by the forward, in real arithmetic;
* what depends on the query times alone (query points, their sphere coordinates, ILT weights) is
  kept for the last grid seen;
* in float64 on the CPU, the encoder GRU and every elementwise step of the decoder run in the fused
  C kernels of :mod:`nlmodels._native` (same numbers as the torch path to rounding).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from nlmodels import _native
from nlmodels._gru import gru_final_output
from nlmodels.base import ForecastModel, batch_times
from nlmodels.ilt import get_ilt
from nlmodels.registry import register_model
from nlmodels.stereographic import from_sphere, max_modulus_phi, to_sphere

__all__ = ["LaplaceRepresentation", "NeuralLaplace", "ReverseGRUEncoder"]


class ReverseGRUEncoder(nn.Module):
    """h: observed trajectory → p ∈ R^K by a GRU run backwards in time (reference encoder)."""

    def __init__(
        self, state_dim: int, latent_dim: int, units: int, layers: int, encode_times: bool
    ) -> None:
        super().__init__()
        self.encode_times = encode_times
        self.gru = nn.GRU(state_dim + int(encode_times), units, layers, batch_first=True)
        self.linear_out = nn.Linear(units, latent_dim)
        nn.init.xavier_uniform_(self.linear_out.weight)

    def forward(self, obs_t: torch.Tensor, obs_x: torch.Tensor) -> torch.Tensor:
        inputs = obs_x
        if self.encode_times:
            times = batch_times(obs_t, obs_x.shape[0]).to(obs_x.dtype)
            inputs = torch.cat((obs_x, times.unsqueeze(-1)), dim=-1)
        reversed_inputs = torch.flip(inputs, dims=(1,))
        if reversed_inputs.device.type == "cpu":
            # same maths as nn.GRU, fwd+bwd ~6x faster on the CPU in float64 with the native
            # kernels, ~2x without (see nlmodels._gru)
            last = gru_final_output(reversed_inputs, self.gru)
        else:
            last = self.gru(reversed_inputs)[0][:, -1, :]
        return self.linear_out(last)


# Output elements per chunk of the fused decoder (~1 MB of float64): temporaries stay cache-sized;
# measured 2-4x faster than whole-batch elementwise chains.
_CHUNK_ELEMENTS = 1 << 17


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
    elementwise runs in the fused C kernels of :mod:`nlmodels._native` where they apply (float64
    on the CPU), else as the torch twin below.

    Shapes: per_time [1 or B, T, H], per_traj [B, H], w_abs/w_arg [1 or B, T, 1, Q].
    """

    @staticmethod
    def forward(  # type: ignore[override]
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
        ctx.native = _native.usable(per_time, per_traj, w2, b2, w3, b3, w_abs, w_arg)
        if ctx.native:  # the kernels take the ILT weights as [(B,) Q, T]
            w_abs, w_arg = (w[:, :, 0].transpose(1, 2).contiguous() for w in (w_abs, w_arg))
        args = (per_time, per_traj, w2, b2, w3, b3, w_abs, w_arg, state_dim, phi_span, phi_centre)
        chunk_forward = _native_chunk_forward if ctx.native else _torch_chunk_forward
        ctx.saved_chunks = [
            chunk_forward(lo, min(lo + chunk, batch), x, *args) for lo in range(0, batch, chunk)
        ]
        ctx.chunk = chunk
        ctx.save_for_backward(per_time, w2, w3)
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_x):  # type: ignore[override]
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
    call = _native.call
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
        _native.call(
            "nl_sphere_out_backward", rows, state_dim, d_out_t.shape[0] // (2 * state_dim),
            d_out_t, grad_x, g_out_t, g_b3, d_out_t.new_empty(state_dim * rows),
        )  # fmt: skip
        return g_out_t.T

    @staticmethod
    def tanh(g, h, g_bias):
        _native.call("nl_tanh_backward", g.shape[0], g.shape[1], g, h, g_bias)
        return g

    @staticmethod
    def first(g, h1, lo, hi, g_time, g_traj):
        per_row = g_time.shape[0] != 1
        _native.call(
            "nl_first_hidden_backward", hi - lo, g_time.shape[1], g.shape[1], int(per_row), g,
            h1, g_time[lo:hi] if per_row else g_time, g_traj[lo:hi],
        )  # fmt: skip


class LaplaceRepresentation(nn.Module):
    """g(p, s): the Laplace representation network, evaluated on all Q query points jointly.

    Parameters are laid out as the reference's ``Linear(2Q+K → H) · tanh · Linear(H → H) · tanh ·
    Linear(H → 2QD)``; the first layer's weight columns are ordered [query features, p].
    """

    def __init__(
        self,
        n_query: int,
        state_dim: int,
        latent_dim: int,
        units: int,
        stereographic: bool,
        max_frequency: float | None,
    ) -> None:
        super().__init__()
        self.n_query = n_query
        self.state_dim = state_dim
        self.stereographic = stereographic
        self.first = nn.Linear(2 * n_query + latent_dim, units)
        self.hidden = nn.Linear(units, units)
        self.out = nn.Linear(units, 2 * n_query * state_dim)
        for layer in (self.first, self.hidden, self.out):
            nn.init.xavier_uniform_(layer.weight)
        self.phi_min = -math.pi / 2
        self.phi_span = max_modulus_phi(max_frequency) - self.phi_min

    def query_features(self, s: torch.Tensor) -> torch.Tensor:
        """Input features of the query points ``s`` [..., Q] → [..., 2Q]."""
        if self.stereographic:
            theta, phi = to_sphere(s)
            return torch.cat((theta, phi), dim=-1)
        return torch.cat((s.real, s.imag), dim=-1)

    def _first_layer(
        self, features: torch.Tensor, p: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first layer split by input: ``[(B,) T, H]`` once per time point, ``[B, H]`` per p."""
        n_feat = features.shape[-1]
        w_s, w_p = self.first.weight[:, :n_feat], self.first.weight[:, n_feat:]
        return features @ w_s.T + self.first.bias, p @ w_p.T

    def raw(self, features: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Network output as two ``[B, T, D, Q]`` tensors (θ/Re rows, φ/Im rows), pre-activation.

        ``features``: [T, 2Q] (shared grid) or [B, T, 2Q]; ``p``: [B, K].
        """
        per_time, per_traj = self._first_layer(features, p)
        h = torch.tanh(per_time + per_traj.unsqueeze(1))
        h = torch.tanh(self.hidden(h))
        out = self.out(h)
        out = out.view(*out.shape[:-1], 2 * self.state_dim, self.n_query)
        return out[..., : self.state_dim, :], out[..., self.state_dim :, :]

    def evaluate(self, features: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """F at the query points, complex ``[B, T, D, Q]``."""
        a, b = self.raw(features, p)
        if not self.stereographic:
            return torch.complex(a, b)
        theta = torch.tanh(a) * math.pi
        phi = (torch.tanh(b) + 1.0) * (0.5 * self.phi_span) + self.phi_min
        return from_sphere(theta, phi)

    def reconstruct_linear(
        self, features: torch.Tensor, p: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """x = Σ_q Re(w_q F_q) for a linear ILT with weights ``[(B,) T, Q]`` → ``[B, T, D]``."""
        if not self.stereographic:
            a, b = self.raw(features, p)
            w = weights.unsqueeze(-2)
            return (a * w.real - b * w.imag).sum(-1)
        per_time, per_traj = self._first_layer(features, p)
        if per_time.dim() == 2:
            per_time = per_time.unsqueeze(0)
        w = weights.unsqueeze(-2)
        if w.dim() == 3:
            w = w.unsqueeze(0)
        return _FusedSphereDecoder.apply(
            per_time,
            per_traj,
            self.hidden.weight,
            self.hidden.bias,
            self.out.weight,
            self.out.bias,
            w.abs(),
            w.angle(),
            self.state_dim,
            self.phi_min,
            self.phi_span,
        )


@register_model("neural_laplace")
class NeuralLaplace(ForecastModel):
    """Neural Laplace: encode the observed prefix to p, decode x(t) = ILT{g(p, ·)}(t) at any t.

    Args:
        state_dim: D, the trajectory dimension.
        latent_dim: K, the size of p (paper default 2).
        encoder_units, encoder_layers: GRU width and depth of the reverse-time encoder (21, 2).
        laplace_units: H, the width of g's hidden layers (64, as the reference code).
        ilt: ILT algorithm name (:data:`nlmodels.ilt.ILT_ALGORITHMS`), ``fourier`` by default.
        terms: reconstruction terms (2N+1 = 33 in the paper).
        stereographic: learn F on the Riemann sphere (True) or as raw (Re, Im) (ablation).
        encode_times: append observation times to the encoder input.
        max_frequency: low-pass option (Appendix C): bound |F(s)| ≤ max_frequency through φ_max.
        ilt_options: extra keyword options of the ILT algorithm.
    """

    def __init__(
        self,
        state_dim: int,
        *,
        latent_dim: int = 2,
        encoder_units: int = 21,
        encoder_layers: int = 2,
        laplace_units: int = 64,
        ilt: str = "fourier",
        terms: int = 33,
        stereographic: bool = True,
        encode_times: bool = False,
        max_frequency: float | None = None,
        ilt_options: dict[str, float] | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("state_dim", state_dim),
            ("latent_dim", latent_dim),
            ("encoder_units", encoder_units),
            ("encoder_layers", encoder_layers),
            ("laplace_units", laplace_units),
        ):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if max_frequency is not None and not stereographic:
            raise ValueError("max_frequency (low-pass filter) needs stereographic=True")
        self.state_dim = int(state_dim)
        self.latent_dim = int(latent_dim)
        self.ilt = get_ilt(ilt, terms=terms, **(ilt_options or {}))
        self.encoder = ReverseGRUEncoder(
            self.state_dim, self.latent_dim, encoder_units, encoder_layers, encode_times
        )
        self._grid_cache: tuple | None = None  # see _grid_terms
        self.laplace = LaplaceRepresentation(
            self.ilt.n_query,
            self.state_dim,
            self.latent_dim,
            laplace_units,
            stereographic,
            max_frequency,
        )

    def encode(self, obs_t: torch.Tensor, obs_x: torch.Tensor) -> torch.Tensor:
        """p = h(observed prefix), ``[B, latent_dim]``."""
        if obs_x.dim() != 3 or obs_x.shape[-1] != self.state_dim:
            raise ValueError(
                f"obs_x must be [B, T_o, {self.state_dim}], got shape {tuple(obs_x.shape)}"
            )
        return self.encoder(obs_t, obs_x)

    def decode(self, p: torch.Tensor, query_t: torch.Tensor) -> torch.Tensor:
        """x at ``query_t`` ([T_q] or [B, T_q]) from the representation p: ``[B, T_q, D]``.

        One evaluation of g per set of query times, whatever the horizon.
        """
        if query_t.dim() not in (1, 2):
            raise ValueError(f"query_t must be [T] or [B, T], got shape {tuple(query_t.shape)}")
        t = query_t.to(dtype=torch.float64, device=p.device)
        if t.dim() == 2 and t.shape[0] == 1:
            t = t[0]
        features, weights = self._grid_terms(t, p.dtype)
        self.count_nfe()
        if weights is not None:
            return self.laplace.reconstruct_linear(features, p, weights)
        fs = self.laplace.evaluate(features, p)  # [B, T, D, Q]
        t_b = t.unsqueeze(-2) if t.dim() == 2 else t  # [(B, 1,) T]
        x = self.ilt.reconstruct(fs.transpose(1, 2).to(torch.complex128), t_b)  # [B, D, T]
        return x.transpose(1, 2).to(p.dtype)

    def forward(
        self, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
    ) -> torch.Tensor:
        return self.decode(self.encode(obs_t, obs_x), query_t)

    def _grid_terms(
        self, t: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What depends on the query times alone: g's input features of the query points and,
        for a linear ILT, its weights. Training decodes the same grid batch after batch, so the
        last grid's terms are kept (compared by value: a grid edited in place is recomputed)."""
        cached = None if t.requires_grad else self._grid_cache
        if (
            cached is not None
            and cached[1] == dtype
            and cached[0].shape == t.shape
            and cached[0].device == t.device
            and torch.equal(cached[0], t)
        ):
            return cached[2], cached[3]
        features = self.laplace.query_features(self.ilt.query(t)).to(dtype)  # [(B,) T, 2Q]
        weights = None
        if self.ilt.is_linear:
            weights = self.ilt.weights(t)  # [(B,) T, Q] complex128
            if dtype != torch.float64:
                weights = weights.to(torch.complex64)
        if not t.requires_grad:
            self._grid_cache = (t.clone(), dtype, features, weights)
        return features, weights
