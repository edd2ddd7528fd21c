"""Batched method of steps for delay differential equations with constant history.

One integrator serves every delay system of the benchmark:
a fixed-step classical RK4 whose step ``h = tau / m`` divides the delay, so the delayed argument of
the stages at ``t_n`` and ``t_n + h`` falls exactly on earlier nodes and the one at ``t_n + h/2`` on
an interval midpoint, obtained by cubic Hermite interpolation from the stored node values and
derivatives (fourth order, like RK4 itself).  The derivative jump of a constant history at the start
time (and its smoothed echoes at ``t0 + k tau``) therefore always lies on a node, so every step
integrates a smooth piece and the scheme keeps its order.  All trajectories advance together as one
``[N, D]`` array; only the last ``m + 1`` nodes are kept (ring buffer), and the requested output
times are filled by the same Hermite interpolation as soon as their step is done.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# f(t, x, x_delayed) -> dx/dt, all arrays [N, D]
DelayRhs = Callable[[float, np.ndarray, np.ndarray], np.ndarray]


def _hermite(x0: np.ndarray, x1: np.ndarray, f0: np.ndarray, f1: np.ndarray, s, h: float):
    """Cubic Hermite interpolant on one step at fraction ``s`` in [0, 1] (broadcasts over s)."""
    s2 = s * s
    s3 = s2 * s
    return (
        (2 * s3 - 3 * s2 + 1) * x0
        + (s3 - 2 * s2 + s) * h * f0
        + (-2 * s3 + 3 * s2) * x1
        + (s3 - s2) * h * f1
    )


def solve_constant_history_dde(
    rhs: DelayRhs,
    history: np.ndarray,
    t0: float,
    tau: float,
    t_out: np.ndarray,
    max_step: float = 0.01,
) -> np.ndarray:
    """Solve ``x'(t) = rhs(t, x(t), x(t - tau))`` with ``x(t) = history`` for ``t <= t0``.

    Args:
        rhs: vectorised right-hand side on ``[N, D]`` arrays.
        history: ``[N, D]`` constant history values (also the value at ``t0``).
        t0: start time (first grid time, the reference ``ddeint`` convention).
        tau: the delay, ``> 0``.
        t_out: increasing output times, all ``>= t0``.
        max_step: the step is ``tau / m`` with the smallest integer ``m`` giving ``h <= max_step``.

    Returns:
        ``[N, len(t_out), D]`` float64 solution at ``t_out``.
    """
    history = np.asarray(history, dtype=np.float64)
    t_out = np.asarray(t_out, dtype=np.float64)
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    if t_out.size and t_out[0] < t0:
        raise ValueError("output times must not precede the start time t0")
    m = max(1, int(np.ceil(tau / max_step - 1e-12)))
    h = tau / m
    span = float(t_out[-1] - t0) if t_out.size else 0.0
    n_steps = max(1, int(np.ceil(span / h - 1e-9)))

    # Output k lies in step interval [t_i, t_{i+1}] with i = floor((t_k - t0) / h).
    pos = (t_out - t0) / h
    interval = np.clip(np.floor(pos).astype(np.int64), 0, n_steps - 1)
    frac = pos - interval
    # Group output indices by interval once, so the time loop only touches the steps that have any.
    order = np.argsort(interval, kind="stable")
    starts = np.searchsorted(interval[order], np.arange(n_steps + 1))

    n_buf = m + 2  # nodes n - m .. n + 1
    xs = np.empty((n_buf, *history.shape))
    fs = np.empty_like(xs)
    out = np.empty((history.shape[0], t_out.size, history.shape[1]))

    def node(j: int) -> np.ndarray:
        return xs[j % n_buf] if j >= 0 else history

    def midpoint(j: int) -> np.ndarray:
        # Delayed value at the midpoint of [t_j, t_{j+1}]; wholly in the history when j + 1 <= 0.
        if j + 1 <= 0:
            return history
        a, b = j % n_buf, (j + 1) % n_buf
        return 0.5 * (xs[a] + xs[b]) + (h / 8.0) * (fs[a] - fs[b])

    xs[0] = history
    fs[0] = rhs(t0, history, history)  # right derivative at t0: the history derivative is 0
    for n in range(n_steps):
        tn = t0 + n * h
        a, b = n % n_buf, (n + 1) % n_buf
        x = xs[a]
        k1 = fs[a]
        xd_mid = midpoint(n - m)
        k2 = rhs(tn + 0.5 * h, x + (0.5 * h) * k1, xd_mid)
        k3 = rhs(tn + 0.5 * h, x + (0.5 * h) * k2, xd_mid)
        k4 = rhs(tn + h, x + h * k3, node(n - m + 1))
        xs[b] = x + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        fs[b] = rhs(tn + h, xs[b], node(n + 1 - m))
        lo, hi = starts[n], starts[n + 1]
        if hi > lo:
            idx = order[lo:hi]
            s = frac[idx][None, :, None]
            out[:, idx, :] = _hermite(
                xs[a][:, None], xs[b][:, None], fs[a][:, None], fs[b][:, None], s, h
            )
    return out
