"""Neural Laplace (Holt, Qian & van der Schaar, ICML 2022).

x(t) = ILT{F(p, ·)}(t): an encoder h maps the observed prefix to p ∈ R^K, a network g gives the
Laplace representation F(p, s) in Riemann-sphere coordinates, and an inverse Laplace transform turns
F at the algorithm's query points s_1..s_Q(t) into x(t).

Architecture as in the paper's reference implementation (github.com/samholt/NeuralLaplace):

* encoder h: the observed sequence reversed in time through a 2-layer GRU (21 units), its last
  output through a Xavier-initialised Linear to K;
* g: one evaluation per time point on all Q query points jointly, input
  ``[θ_1..θ_Q, φ_1..φ_Q, p_1..p_K]``, MLP ``2Q+K → H → H → 2QD`` with tanh, output rows
  ``θ = π·tanh(·)`` (first D) and ``φ = φ_min + (φ_max − φ_min)(tanh(·)+1)/2`` (next D);
* ILT: any of :mod:`nlmodels.ilt`.

Two rearrangements that change no number: g's first layer is split into the part that depends on
p (once per trajectory) and the part that depends on the query points (once per time point), and
what depends on the query times alone (query points, their sphere coordinates, ILT weights) is
kept for the last grid seen. The encoder GRU and, for a linear ILT, the decoder from g's first
layer to x run through the fast paths of :mod:`nlmodels.accel` (same maths, tested against the
plain formulas here).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nlmodels import accel
from nlmodels.accel._select import transformed
from nlmodels.base import ForecastModel, batch_times, recording_host_bools
from nlmodels.ilt import get_ilt
from nlmodels.model_registry import register_model
from nlmodels.stereographic import from_sphere, max_modulus_phi, to_sphere

#: ``torch.compiler.disable`` in the lazy form torch gives its own modules (``torch/_compile.py``):
#: TorchDynamo, which the public decorator imports as the class is defined (3 s), is imported at
#: the first call instead, so a process that only reads the models' settings never loads it.
#: The public decorator where a torch lacks the lazy one.
_eager_under_compile = getattr(torch, "_disable_dynamo", torch.compiler.disable)

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
        last = accel.gru_final_output(torch.flip(inputs, dims=(1,)), self.gru)  # [B, units]
        return self.linear_out(last)


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
        return from_sphere(*self._angles(a, b))

    def _angles(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(θ, φ) from the network's two output rows: θ = π tanh(a), φ ∈ [φ_min, φ_max]."""
        return torch.tanh(a) * math.pi, (torch.tanh(b) + 1.0) * (0.5 * self.phi_span) + self.phi_min

    def reconstruct_linear(
        self, features: torch.Tensor, p: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """x = Σ_q Re(w_q F_q) for a linear ILT with weights ``[(B,) T, Q]`` → ``[B, T, D]``."""
        # the same, fused (nlmodels.accel); the plain formulas under vmap (packed training)
        if self.stereographic and accel.select(p, self.out.weight) != "plain":
            per_time, per_traj = self._first_layer(features, p)
            return accel.fused_sphere_decode(
                per_time, per_traj, self.hidden, self.out, weights, self.state_dim,
                self.phi_min, self.phi_span,
            )  # fmt: skip
        a, b = self.raw(features, p)  # Re F, Im F, or the sphere's rows
        if self.stereographic:  # F = v(θ, φ) = tan(φ/2 + π/4) e^{iθ}, in real arithmetic
            theta, phi = self._angles(a, b)
            radius = torch.tan(phi / 2 + math.pi / 4)
            a, b = radius * torch.cos(theta), radius * torch.sin(theta)
        w = weights.unsqueeze(-2)  # [(B,) T, 1, Q]
        return (a * w.real - b * w.imag).sum(-1)


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
        if query_t.shape[-1] < 1:  # as every model refuses it (no grid to reconstruct on)
            raise ValueError("query_t must hold at least one time")
        t = query_t.to(dtype=torch.float64, device=p.device)
        if t.dim() == 2 and t.shape[0] == 1:
            t = t[0]
        features, weights = self._grid_terms(t, p.dtype)
        self._count_evaluation()
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

    @_eager_under_compile
    def _count_evaluation(self) -> None:
        """One evaluation of g, counted eagerly: under ``torch.compile`` a traced counter would
        be a constant of the graph, recompiled at every call."""
        self.count_nfe()

    @_eager_under_compile
    def _grid_terms(
        self, t: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What depends on the query times alone: g's input features of the query points and,
        for a linear ILT, its weights. Training decodes the same grid batch after batch, so the
        last grid's terms are kept (compared by value: a grid edited in place is recomputed).
        Eager under ``torch.compile`` too: a cache lookup, not part of the traced maths. No
        cache for per-member grids under ``vmap`` (packed training) nor while a CUDA graph is
        captured (the graph computes the terms itself: it must neither read the host nor keep
        pointers to a cache entry that a later grid replaces)."""
        cacheable = not (t.requires_grad or transformed(t) or recording_host_bools())
        cached = self._grid_cache if cacheable else None
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
        if cacheable:
            self._grid_cache = (t.clone(), dtype, features, weights)
        return features, weights
