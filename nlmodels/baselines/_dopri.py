"""Dormand–Prince 5(4) over lanes: many adaptive solves stepped together, each its own.

A *lane* is one independent initial-value problem (for a packed model: one member's whole batch
of trajectories). All lanes are stepped in lockstep iterations, the way ``jax.vmap`` of an
adaptive solve steps in diffrax (Kidger, 2021, "On Neural Differential Equations", §5): every
lane keeps its own time, step size, accept/reject decision, FSAL derivative, dense-output
interval and progress through its output times; a lane that has passed its last output time
(or failed) is frozen by ``torch.where`` masks and steps by zero. The vector field is evaluated
once per stage for all lanes together.

The arithmetic of each lane is that of ``torchdiffeq``'s ``dopri5`` (Chen, 2018;
``torchdiffeq/_impl/rk_common.py``, ``misc.py``, ``interp.py``): the Dormand–Prince tableau
(Dormand & Prince, 1980) with Shampine's dense-output midpoint, the initial step of Hairer,
Nørsett & Wanner (1993, §II.4), the RMS error norm over the lane's whole state, step control
with safety 0.9, growth at most 10 and shrinkage at least 0.2, the stage at the step's end taken
just before it, and 4th-order interpolation at the output times. Its gradients are those of
backpropagating through torchdiffeq's steps (the first step size is differentiable, later ones
are not). One difference: where torchdiffeq raises (a non-finite state or an underflowing step),
the lane is marked failed and its remaining outputs are NaN.

No tensor value is read on the host except the end test ("are all lanes done?"), every
``check_every`` iterations (default 4 on an accelerator). On the CPU, where a read costs nothing,
the test runs every iteration, and a single lane also reads its accept decision: it then steps
without masks, as torchdiffeq does, and gives the same numbers as the masked path.

With a fixed budget (``iterations``) not even the end test is read: the solve runs exactly that
many masked iterations, so that it can be captured into a CUDA graph (whose replay cannot ask
the host how far to go), and reports the lanes the budget left unfinished (their outputs beyond
the last reached are NaN). Lanes that finish early step by zero, as they do beside slower lanes,
so a lane's values are those of the masked solve without a budget whenever the budget suffices.
This is the fixed-length ``while_loop`` of diffrax (``max_steps``: a solve that needs more
steps is an error) rather than a plan of step sizes chosen beforehand: each lane keeps its own
error control, and only the number of iterations is decided before the solve.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = ["ORDER", "LaneSolution", "dopri5_lanes", "interp_evaluate", "interp_fit", "tableau"]

#: ``field(t, y)``: ``t [L]`` (in y's dtype), ``y [L, *S]`` → ``dy/dt [L, *S]``.
LaneField = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# The Dormand–Prince–Shampine tableau, written as torchdiffeq's dopri5.py writes it.
_ALPHA = (1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
_BETA = (
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_C_ERROR = (
    35 / 384 - 1951 / 21600,
    0,
    500 / 1113 - 22642 / 50085,
    125 / 192 - 451 / 720,
    -2187 / 6784 - -12231 / 42400,
    11 / 84 - 649 / 6300,
    -1.0 / 60.0,
)
_C_MID = (
    6025192743 / 30085553152 / 2,
    0,
    51252292925 / 65400821598 / 2,
    -2691868925 / 45128329728 / 2,
    187940372067 / 1594534317056 / 2,
    -1776094331 / 19743644256 / 2,
    11237099 / 235043384 / 2,
)
ORDER = 5
_SAFETY, _IFACTOR, _DFACTOR = 0.9, 10.0, 0.2


@dataclass(frozen=True)
class _Tableau:
    alpha: torch.Tensor
    beta: tuple[torch.Tensor, ...]
    c_error: torch.Tensor
    mid: torch.Tensor
    safety: torch.Tensor
    ifactor: torch.Tensor
    dfactor: torch.Tensor
    exponent: torch.Tensor


@lru_cache(maxsize=16)
def tableau(dtype: torch.dtype, device: torch.device) -> _Tableau:
    def t(values, dt=dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64).to(device=device, dtype=dt)

    f64 = torch.float64
    return _Tableau(
        alpha=t(_ALPHA),
        beta=tuple(t(b) for b in _BETA),
        c_error=t(_C_ERROR),
        mid=t(_C_MID),
        safety=t(_SAFETY, f64),
        ifactor=t(_IFACTOR, f64),
        dfactor=t(_DFACTOR, f64),
        exponent=torch.tensor(ORDER, dtype=f64, device=device).reciprocal(),
    )


@dataclass(frozen=True)
class LaneSolution:
    """The solution at the output times and each lane's step counts."""

    #: ``[L, T, *S]``: the state at each lane's output times (NaN after a lane failed)
    y: torch.Tensor
    #: ``[L]``: vector-field evaluations torchdiffeq's dopri5 makes for that lane (2 + 6 per step)
    nfe: torch.Tensor
    #: ``[L]``: accepted steps
    accepted: torch.Tensor
    #: ``[L]``: rejected steps
    rejected: torch.Tensor
    #: ``[L]``: lanes that failed (non-finite state or step size, or a step that underflowed)
    failed: torch.Tensor
    #: ``[L]``: lanes a fixed budget of iterations left short of their last output time
    unfinished: torch.Tensor
    #: iterations run (the budget when one was given; with host end tests, as many as needed)
    iterations: int


def _rms(x: torch.Tensor) -> torch.Tensor:
    """torchdiffeq's ``_rms_norm`` over each lane's whole state."""
    return x.abs().pow(2).flatten(1).mean(1).sqrt()


def _previous(t: torch.Tensor) -> torch.Tensor:
    """The float just below ``t`` (torchdiffeq's ``Perturb.PREV``), with ``t``'s gradient."""
    with torch.no_grad():
        below = torch.nextafter(t, t - 1)
    return t + (below - t).detach()


def _initial_step(field, t0, y0, f0, rtol, atol) -> torch.Tensor:
    """torchdiffeq's ``_select_initial_step`` (Hairer, Nørsett & Wanner, 1993, §II.4) per lane,
    differentiable as there.

    torchdiffeq branches in Python, so a norm on the branch not taken is not in its graph; here
    both branches are computed, and a norm enters the gradient only on the lanes that take its
    branch (elsewhere it is the norm of ones: √0's infinite derivative times a zero would be NaN).
    """
    scale = atol + torch.abs(y0) * rtol
    with torch.no_grad():  # the decisions
        d0, d1 = _rms(y0 / scale), _rms(f0 / scale)
        small = (d0 < 1e-5) | (d1 < 1e-5)
    h0 = torch.where(
        small, 1e-6, 0.01 * _rms_on(y0 / scale, ~small) / _rms_on(f0 / scale, ~small)
    ).abs()
    y1 = y0 + _lanes(h0, y0) * f0
    f1 = field(t0 + h0, y1)
    with torch.no_grad():
        d2 = torch.abs(_rms((f1 - f0) / scale) / h0)
        flat = (d1 <= 1e-15) & (d2 <= 1e-15)
        second = ~flat & (d2 > d1)  # Python's max(d1, d2), as torchdiffeq takes it
        first = ~flat & ~second
    largest = torch.where(
        second, torch.abs(_rms_on((f1 - f0) / scale, second) / h0), _rms_on(f0 / scale, first)
    )
    h1_flat = torch.maximum(torch.full_like(h0, 1e-6), h0 * 1e-3)
    h1_step = (0.01 / largest) ** (1.0 / float(ORDER))
    h1 = torch.where(flat, h1_flat, h1_step).abs()
    return torch.minimum(100 * h0, h1).to(t0.dtype)


def _rms_on(x: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
    """:func:`_rms` (``.abs()``ed, as torchdiffeq's) on ``lanes``, 1 on the others."""
    return _rms(torch.where(_lanes(lanes, x), x, 1.0)).abs()


def _lanes(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[L]`` or ``[L, k]`` viewed to broadcast against ``like [L, *S]`` (or ``[L, *S, k]``)."""
    extra = (1,) * (like.dim() - 1)
    return v.view(v.shape[0], *extra, *v.shape[1:])


def interp_fit(y0, y1, k, dt, mid) -> list[torch.Tensor]:
    """torchdiffeq's ``_interp_fit`` (4th-order dense output through Shampine's midpoint)."""
    dt_l = _lanes(dt, y0)
    y_mid = y0 + torch.sum(k * _lanes(dt.unsqueeze(1) * mid, y0), dim=-1)
    f0, f1 = k[..., 0], k[..., -1]
    a = 2 * dt_l * (f1 - f0) - 8 * (y1 + y0) + 16 * y_mid
    b = dt_l * (5 * f0 - 3 * f1) + 18 * y0 + 14 * y1 - 32 * y_mid
    c = dt_l * (f1 - 4 * f0) - 11 * y0 - 5 * y1 + 16 * y_mid
    d = dt_l * f0
    return [y0, d, c, b, a]


def interp_evaluate(coefficients: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """torchdiffeq's ``_interp_evaluate``: the dense output ``coefficients`` (of
    :func:`interp_fit`) at the fraction ``x`` of the step, in its order of operations."""
    total = coefficients[0] + x * coefficients[1]
    power = x
    for c in coefficients[2:]:
        power = power * x
        total = total + power * c
    return total


def dopri5_lanes(
    field: LaneField,
    y0: torch.Tensor,
    t0: torch.Tensor,
    t_out: torch.Tensor,
    *,
    rtol: float,
    atol: float,
    check_every: int | None = None,
    masked: bool = False,
    iterations: int | None = None,
) -> LaneSolution:
    """Solve ``dy/dt = field(t, y)`` for every lane from ``y0 [L, *S]`` at ``t0 [L]``.

    ``t_out [L, T]``: each lane's output times, strictly increasing and not before its ``t0``
    (an output at ``t0`` is ``y0``). Each lane takes exactly the steps, and gives the values,
    of ``torchdiffeq.odeint(f, y0[l], torch.cat([t0[l:l+1], t_out[l]]), method="dopri5",
    rtol=rtol, atol=atol)[1:]`` (to rounding), whatever the other lanes do.
    ``check_every``: iterations between the host reads of the end test (default: 1 on the CPU,
    where a read costs nothing, and 4 on an accelerator).
    ``masked``: step a single lane through the masks too, as several lanes are stepped (a lone
    lane otherwise reads its decisions on the host and skips them). The values are the same,
    but the masks add edges to the autograd graph that change the order in which gradients are
    summed: with ``masked`` a lane's gradients are bitwise those it gets beside other lanes.
    ``iterations``: run exactly this many step attempts (accepted or rejected) with no host read
    at all (capturable), every lane masked; lanes not done by then are flagged ``unfinished``.
    Where the budget suffices, values and gradients are bitwise those of ``masked`` without it.
    """
    if y0.dim() < 2 or t0.shape != y0.shape[:1] or t_out.dim() != 2:
        raise ValueError(
            f"dopri5_lanes needs y0 [L, *S], t0 [L], t_out [L, T]; got {tuple(y0.shape)}, "
            f"{tuple(t0.shape)}, {tuple(t_out.shape)}"
        )
    n_lanes, n_out = t_out.shape
    ydt, device = y0.dtype, y0.device
    tdt = torch.promote_types(torch.float64, ydt)
    tab = tableau(ydt, device)
    every = check_every or (1 if device.type == "cpu" else 4)
    if iterations is not None and iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")

    def call(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return field(t.to(ydt), y)

    t = t0.to(tdt)
    t_out = t_out.to(tdt)
    y = y0
    f = call(t, y0)
    dt = _initial_step(call, t, y0, f, rtol, atol)
    zeros = torch.zeros_like(y0)
    # Until a first step is accepted, the interval [t0, t0 + 1] with the constant y0: an output
    # at t0 is read at x = 0 (y0 exactly); later outputs wait for their step.
    coeffs = [y0, zeros, zeros, zeros, zeros]
    left, right = t, t + 1
    assigned = torch.full((n_lanes, n_out), -1, dtype=torch.long, device=device)
    failed = torch.zeros(n_lanes, dtype=torch.bool, device=device)
    attempts = torch.zeros(n_lanes, dtype=torch.long, device=device)
    accepted = torch.zeros_like(attempts)
    history: list[tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]] = []
    on_host = n_lanes == 1 and every == 1 and not masked and iterations is None
    while True:
        n = len(history)
        # Outputs reached by the lane's accepted steps are read from its current interval.
        newly = (assigned < 0) & (t_out <= t.unsqueeze(1)) & ~failed.unsqueeze(1)
        assigned = torch.where(newly, n, assigned)
        history.append((coeffs, left, right))
        done = failed | (assigned[:, -1] >= 0)
        if iterations is not None:
            if n == iterations:
                break
        elif n % every == 0 and bool(done.all()):
            break
        with torch.no_grad():
            # torchdiffeq raises here; a non-finite state shows as a non-finite step size.
            bad = ~done & (~torch.isfinite(dt) | ~(t + dt > t))
        failed = failed | bad
        active = ~(done | bad)
        if on_host:  # one lane, decisions read on the host: no masks needed
            if bool(bad):
                continue
            step = dt
        else:
            step = torch.where(active, dt, 0.0)  # frozen lanes step by zero: finite, masked
        t1 = t + step
        h = step.to(ydt)
        ks = [f]
        y_stage = y
        for i in range(6):
            if _ALPHA[i] == 1.0:
                ti = _previous(t1.to(ydt))
            else:
                ti = t.to(ydt) + tab.alpha[i] * h
            k = torch.stack(ks, dim=-1)
            y_stage = y + torch.sum(k * _lanes(h.unsqueeze(1) * tab.beta[i], y), dim=-1)
            ks.append(field(ti, y_stage))
        k = torch.stack(ks, dim=-1)
        y1, f1 = y_stage, ks[-1]  # FSAL: the last stage is the 5th-order solution at t1
        with torch.no_grad():
            error = torch.sum(k * _lanes(h.unsqueeze(1) * tab.c_error, y), dim=-1)
            tol = atol + rtol * torch.max(y.abs(), y1.abs())
            ratio = _rms(error / tol).abs()
            accept = (ratio <= 1) | (step <= 0)
            er = ratio.to(tdt)
            dfactor = torch.where(er < 1, torch.ones_like(tab.dfactor), tab.dfactor)
            factor = torch.minimum(
                tab.ifactor, torch.maximum(tab.safety / er**tab.exponent, dfactor)
            )
            dt_next = torch.where(er == 0, step * tab.ifactor, step * factor).clamp(min=0)
        attempts = attempts + active
        if on_host:
            if bool(accept):
                coeffs, left, right = interp_fit(y, y1, k, h, tab.mid), t, t1
                y, f, t = y1, f1, t1
                accepted = accepted + 1
            dt = dt_next
            continue
        take = active & accept
        lane_take = _lanes(take, y)
        fit = interp_fit(y, y1, k, h, tab.mid)
        coeffs = [torch.where(lane_take, new, old) for new, old in zip(fit, coeffs)]
        left = torch.where(take, t, left)
        right = torch.where(take, t1, right)
        y = torch.where(lane_take, y1, y)
        f = torch.where(lane_take, f1, f)
        t = torch.where(take, t1, t)
        dt = torch.where(active, dt_next, dt)
        accepted = accepted + take
    # Dense output: each output from the interval current when the lane reached it.
    rows = torch.arange(n_lanes, device=device).unsqueeze(1)
    at = assigned.clamp(min=0)
    stacked = [torch.stack([h[0][j] for h in history]) for j in range(5)]
    cs = [c[at, rows] for c in stacked]  # [L, T, *S]
    lo = torch.stack([h[1] for h in history])[at, rows]
    hi = torch.stack([h[2] for h in history])[at, rows]
    lane_out = (n_lanes, n_out) + (1,) * (y0.dim() - 1)
    total = interp_evaluate(cs, ((t_out - lo) / (hi - lo)).to(ydt).view(lane_out))
    reached = (assigned >= 0).view(lane_out)
    out = torch.where(reached, total, torch.full_like(total, float("nan")))
    return LaneSolution(
        out, 2 + 6 * attempts, accepted, attempts - accepted, failed, ~done, len(history) - 1
    )
