"""Measurements shared by the benchmark scripts and the studies (pure torch).

* :func:`ilt_accuracy`: RMSE of every ILT on transform pairs with exact inverses, and µs per time
  point on the paper's Table 12 pair (F(s) = s/(s²+1) → cos t on 999 points of (0, 10]);
* :func:`trajectories`: smooth spirals to time a model's training on (the timing itself is
  ``nltrain.epoch_seconds``: the real training loop, which lives above this package);
* :func:`horizon_nfe`: function evaluations to extrapolate one point Δt ahead (paper Fig. NFE).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from nlmodels.base import ForecastModel
from nlmodels.ilt import get_ilt

__all__ = [
    "ILT_ORDER",
    "ILT_PAIRS",
    "PAPER_ILT_RMSE",
    "decoder_nfe",
    "horizon_nfe",
    "ilt_accuracy",
    "rmse",
    "trajectories",
]

ILT_ORDER = ["fourier", "dehoog", "talbot", "stehfest", "cme", "euler"]
PAPER_ILT_RMSE = {
    "fourier": 0.0171,
    "dehoog": 7.056e-10,
    "talbot": 0.4365,
    "stehfest": 0.2842,
    "cme": 0.0069,
    "euler": None,
}
# (label, F(s), x(t), t grid): torch expressions (strings, so that the benchmark can evaluate
# them the same way in the reference package's interpreter).
ILT_PAIRS = [
    ("s/(s^2+1)", "s / (s**2 + 1)", "torch.cos(t)", "torch.linspace(0, 10, 1000)[1:]"),
    ("1/(s+1)", "1 / (s + 1)", "torch.exp(-t)", "torch.linspace(0, 10, 1000)[1:]"),
    ("1/(s^2+1)", "1 / (s**2 + 1)", "torch.sin(t)", "torch.linspace(0, 10, 1000)[1:]"),
    (
        "1/sqrt(s)",
        "1 / torch.sqrt(s)",
        "1 / torch.sqrt(torch.pi * t)",
        "torch.linspace(0.1, 10, 100)",
    ),
    ("1/s^2", "1 / s**2", "t", "torch.linspace(0.1, 10, 100)"),
    (
        "e^{-s}/s",
        "torch.exp(-s) / s",
        "(t > 1).double()",
        "torch.cat([torch.linspace(0.1, 0.8, 50), torch.linspace(1.3, 5, 50)])",
    ),
    ("1/(s+1/2)^2", "1 / (s + 0.5)**2", "t * torch.exp(-t / 2)", "torch.linspace(0.1, 10, 100)"),
]


def rmse(est: torch.Tensor, exact: torch.Tensor) -> float:
    """Root-mean-square error."""
    return float(torch.sqrt(torch.mean((est - exact) ** 2)))


def ilt_accuracy(terms: int = 33, repeats: int = 30) -> dict[str, dict]:
    """``{"name|pair": {"rmse": ..., "us": ...}}``: RMSE of every algorithm on every pair and µs
    per time point (median of ``repeats``) on the first, Table 12, pair."""
    out: dict[str, dict] = {}
    for name in ILT_ORDER:
        ilt = get_ilt(name, terms=terms)
        for label, f_expr, x_expr, t_expr in ILT_PAIRS:
            t = eval(t_expr).double()
            F = eval("lambda s: " + f_expr)
            x = eval(x_expr)
            rec = {"rmse": rmse(ilt.invert(F, t), x), "us": None}
            if label == ILT_PAIRS[0][0]:
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    ilt.invert(F, t)
                    times.append(time.perf_counter() - t0)
                rec["us"] = statistics.median(times) / t.numel() * 1e6
            out[f"{name}|{label}"] = rec
    return out


def trajectories(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` damped spirals with random frequency, decay, phase and amplitude on t ∈ [0, 20]."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0.0, 20.0, 200, dtype=torch.float64)
    omega, decay, phase, amp = (torch.rand(4, n, 1, generator=g, dtype=torch.float64)).unbind(0)
    omega, decay, phase, amp = 0.5 + omega, 0.1 * decay, 2 * math.pi * phase, 0.5 + amp
    envelope = amp * torch.exp(-decay * t)
    x = torch.stack(
        [envelope * torch.cos(omega * t + phase), envelope * torch.sin(omega * t + phase)], -1
    )
    return t, x


def decoder_nfe(
    model: ForecastModel, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
) -> int:
    """Function evaluations to predict ``query_t``, the encoder's own evaluations excluded."""
    with torch.no_grad():
        encode_nfe = 0
        encode = getattr(model, "encode", None)
        if encode is not None and model.registry_name != "neural_laplace":
            model.reset_nfe()
            encode(obs_t, obs_x)
            encode_nfe = model.nfe
        model.reset_nfe()
        model(obs_t, obs_x, query_t)
    return model.nfe - encode_nfe


def horizon_nfe(model: ForecastModel, t: torch.Tensor, x: torch.Tensor, dt: float) -> int:
    """NFEs to predict one point ``dt`` after the last observation (encoder NFEs excluded)."""
    ot = t[:100]
    return decoder_nfe(model, ot, x[:8, :100], ot[-1:] + dt)
