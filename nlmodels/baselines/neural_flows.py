"""Neural Flows (Biloš et al., 2021): model the solution curve x(t) = F(t, x₀) directly.

Both flows satisfy F(0, x) = x by construction — every layer's update is multiplied by a time
gate φ(t) = tanh(ω t) with φ(0) = 0 — and are invertible in x for every fixed t:

* :class:`CouplingFlow`: affine coupling layers (Dinh et al., 2017) made continuous in time,
  ``y_A = x_A · exp(s(x_B, t) φ_s(t)) + v(x_B, t) φ_v(t)``, ``y_B = x_B``; exact inverse.
* :class:`ResNetFlow`: ``y = x + φ(t) · c · g(x, t)`` with spectrally normalised linear layers,
  tanh, |φ| < 1 and c < 1, so the update is a contraction in x and the layer is invertible
  (Behrmann et al., 2019); the inverse is the fixed point iteration.

The time functions are :class:`TimeTanh` by default. ``time_net = "linear"`` takes
:class:`TimeLinear` (φ(t) = ω t, unbounded) instead, as the paper's reference code builds both
flows (stribor's ``TimeLinear``): tanh features saturate over a forecast window far from t = 0,
so the flow can barely change along it. With it the ResNet flow's update is a contraction, and
the layer invertible, only while |ω t| · c < 1.

The forecasters pair a flow-evolved ODE-RNN encoder (the GRU hidden state is carried between
observations by a flow instead of an ODE solve) with a latent flow decoder.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any, Literal, cast, get_args

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm

from nlmodels.base import ForecastModel
from nlmodels.baselines._encoders import ODERNNEncoder
from nlmodels.baselines._mlp import mlp
from nlmodels.baselines._solve import check_inputs, check_obs
from nlmodels.model_registry import register_model

__all__ = ["CouplingFlow", "NFCoupling", "NFResNet", "ResNetFlow", "TimeLinear", "TimeTanh"]

#: The time functions φ of the flows' layers (see the module's docstring).
TimeNet = Literal["tanh", "linear"]


class _TimeEmbedding(nn.Module):
    """A time function of a given width with learnt frequencies ω, zero at t = 0."""

    def __init__(self, width: int, max_freq: float = 1.0) -> None:
        super().__init__()
        # Log-spaced frequencies in [max_freq/10, max_freq] give slow and fast features.
        start = math.log(max_freq / 10) if width > 1 else math.log(max_freq)
        self.freq = nn.Parameter(torch.logspace(start, math.log(max_freq), width, base=math.e))


class TimeTanh(_TimeEmbedding):
    """Time embedding ``tanh(ω t)`` of a given width: vanishes at t = 0, bounded by 1."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """``t [...]`` → ``[..., width]``."""
        return torch.tanh(t.unsqueeze(-1) * self.freq)


class TimeLinear(_TimeEmbedding):
    """Time embedding ``ω t`` (stribor's ``TimeLinear``): vanishes at t = 0, unbounded; the
    frequencies start as :class:`TimeTanh`'s."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """``t [...]`` → ``[..., width]``."""
        return t.unsqueeze(-1) * self.freq


TIME_NETS: dict[str, type[_TimeEmbedding]] = {"tanh": TimeTanh, "linear": TimeLinear}


def _time_net(name: str) -> type[_TimeEmbedding]:
    if name not in TIME_NETS:
        raise ValueError(f"time_net must be one of {get_args(TimeNet)}, got {name!r}")
    return TIME_NETS[name]


def _check_time(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    t = t.to(x)
    if t.shape != x.shape[:-1]:
        t = t.expand(x.shape[:-1])
    return t


class _CouplingLayer(nn.Module):
    mask: torch.Tensor  # a buffer: which half of the state passes unchanged

    def __init__(
        self,
        dim: int,
        hidden: Sequence[int],
        time_width: int,
        mask: torch.Tensor,
        time_net: TimeNet = "tanh",
    ):
        super().__init__()
        self.register_buffer("mask", mask)
        self.embed = _time_net(time_net)(time_width)
        self.gate = _time_net(time_net)(2 * dim)
        self.net = mlp(dim + time_width, hidden, 2 * dim)

    def _affine(self, t: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale, shift = self.net(torch.cat([kept, self.embed(t)], dim=-1)).chunk(2, dim=-1)
        gate_s, gate_v = self.gate(t).chunk(2, dim=-1)
        return scale * gate_s, shift * gate_v

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        kept = x * self.mask
        log_scale, shift = self._affine(t, kept)
        return kept + (1 - self.mask) * (x * torch.exp(log_scale) + shift)

    def inverse(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        kept = y * self.mask  # the kept half passes unchanged, so s and v are recomputable
        log_scale, shift = self._affine(t, kept)
        return kept + (1 - self.mask) * ((y - shift) * torch.exp(-log_scale))


class _ResNetLayer(nn.Module):
    def __init__(
        self,
        dim: int,
        hidden: Sequence[int],
        time_width: int,
        lipschitz: float,
        time_net: TimeNet = "tanh",
    ):
        super().__init__()
        self.lipschitz = float(lipschitz)
        self.embed = _time_net(time_net)(time_width)
        self.gate = _time_net(time_net)(dim)
        self.net = mlp(dim + time_width, hidden, dim, wrap=spectral_norm)

    def residual(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.gate(t) * self.lipschitz * self.net(torch.cat([x, self.embed(t)], dim=-1))

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x + self.residual(t, x)

    def inverse(self, t: torch.Tensor, y: torch.Tensor, iterations: int = 200) -> torch.Tensor:
        x = y  # Banach iteration x ← y − r(x) converges since r is a contraction in x
        for _ in range(iterations):
            x = y - self.residual(t, x)
        return x


class _Flow(nn.Module):
    layers: nn.ModuleList

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """F(t, x): ``t [...]`` (or broadcastable), ``x [..., dim]`` → ``[..., dim]``."""
        t = _check_time(t, x)
        for layer in self.layers:
            x = layer(t, x)
        return x

    def inverse(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """F(t, ·)⁻¹(y)."""
        t = _check_time(t, y)
        for layer in reversed(self.layers):
            y = cast(_CouplingLayer | _ResNetLayer, layer).inverse(t, y)
        return y


class CouplingFlow(_Flow):
    """Continuous-time affine coupling flow (Biloš et al., 2021); halves alternate per layer."""

    def __init__(
        self,
        dim: int,
        *,
        layers: int = 2,
        hidden: Sequence[int] = (31, 31),
        time_width: int = 8,
        time_net: TimeNet = "tanh",
    ) -> None:
        super().__init__()
        _time_net(time_net)
        idx = torch.arange(dim)
        self.layers = nn.ModuleList(
            _CouplingLayer(dim, hidden, time_width, ((idx + k) % 2 == 0).float(), time_net)
            for k in range(layers)
        )


class ResNetFlow(_Flow):
    """Invertible ResNet flow (Biloš et al., 2021); each update is ``lipschitz``-Lipschitz in x
    (with linear time functions, times |ω t|: see the module's docstring)."""

    def __init__(
        self,
        dim: int,
        *,
        layers: int = 2,
        hidden: Sequence[int] = (26, 26),
        time_width: int = 8,
        lipschitz: float = 0.9,
        time_net: TimeNet = "tanh",
    ) -> None:
        super().__init__()
        if not 0 < lipschitz < 1:
            raise ValueError(f"lipschitz must lie in (0, 1) for invertibility, got {lipschitz}")
        _time_net(time_net)
        self.layers = nn.ModuleList(
            _ResNetLayer(dim, hidden, time_width, lipschitz, time_net) for _ in range(layers)
        )


FLOWS: dict[str, type[_Flow]] = {"coupling": CouplingFlow, "resnet": ResNetFlow}

_PARAMETRIZE_CACHE_LOCK = threading.Lock()


class _NeuralFlowForecaster(ForecastModel):
    """Encoder-decoder forecaster with flows in place of ODE solves (Biloš et al., 2021).

    The ODE-RNN encoder (Rubanova et al., 2019) carries its GRU state between observations with a
    flow over the hidden state and yields the latent z₀ at the first observed time; the latent
    flow gives z(t) = F(t − t₀, z₀) at every query time in one evaluation, and a linear layer
    decodes z to the state. Trained by MSE. NFE counts flow evaluations. ``time_net`` picks
    the flows' time functions (see the module's docstring).
    """

    flow_kind = ""

    def __init__(
        self,
        state_dim: int,
        *,
        latent_dim: int = 2,
        encoder_units: int = 40,
        hidden: Sequence[int] = (31, 31),
        flow_layers: int = 2,
        time_width: int = 8,
        time_net: TimeNet = "tanh",
    ) -> None:
        super().__init__()
        self.state_dim, self.latent_dim = int(state_dim), int(latent_dim)
        flow = FLOWS[self.flow_kind]
        sizes = dict(layers=flow_layers, hidden=hidden, time_width=time_width, time_net=time_net)
        self.encoder = ODERNNEncoder(state_dim, encoder_units, self.latent_dim)
        self.hidden_flow = flow(encoder_units, **sizes)
        self.latent_flow = flow(self.latent_dim, **sizes)
        self.decoder = nn.Linear(self.latent_dim, self.state_dim)

    def _evolve_hidden(self, h: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        self.count_nfe()
        return self.hidden_flow(dt, h)

    def encode(self, obs_t: torch.Tensor, obs_x: torch.Tensor) -> torch.Tensor:
        """Latent state z₀ at each trajectory's first observed time, ``[B, K]``."""
        return self.encoder(check_obs(obs_t, obs_x, self.state_dim), obs_x, self._evolve_hidden)

    def forward(
        self, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
    ) -> torch.Tensor:
        ot, qt = check_inputs(obs_t, obs_x, query_t, self.state_dim)
        # Spectrally normalised weights are computed once per pass, not once per flow evaluation.
        # parametrize's cache is process-global: the lock keeps models forwarding in other
        # threads from reusing (and back-propagating through) this pass's cached weights.
        with _PARAMETRIZE_CACHE_LOCK, parametrize.cached():
            z0 = self.encode(ot, obs_x)
            self.count_nfe()  # one flow evaluation covers every query time
            z = self.latent_flow(qt - ot[:, :1], z0.unsqueeze(1).expand(-1, qt.shape[1], -1))
        return self.decoder(z)


@register_model("nf_coupling")
class NFCoupling(_NeuralFlowForecaster):
    """Neural Flow forecaster with coupling flows: hidden [31, 31], GRU 40 units.

    18,509 parameters for D = 1 (paper, Table 7: 18,307).
    """

    flow_kind = "coupling"


@register_model("nf_resnet")
class NFResNet(_NeuralFlowForecaster):
    """Neural Flow forecaster with ResNet flows: hidden [26, 26], GRU 52 units.

    The GRU is widened to 52 units to match the paper's size: 18,297 parameters for D = 1
    (paper, Table 7: 18,307).
    """

    flow_kind = "resnet"

    def __init__(
        self,
        state_dim: int,
        *,
        encoder_units: int = 52,
        hidden: Sequence[int] = (26, 26),
        **kwargs: Any,
    ) -> None:
        super().__init__(state_dim, encoder_units=encoder_units, hidden=hidden, **kwargs)
