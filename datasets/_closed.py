"""Closed-form solutions of the benchmark systems that have one (paper Section 5 and Appendix C).

Every function is vectorised: ``x0`` / ``phase`` of shape ``[N]`` and times ``[T]`` give ``[N, T]``.
"""

from __future__ import annotations

import math

import numpy as np

_LIBM_EXP = np.frompyfunc(math.exp, 1, 1)


def exp(x) -> np.ndarray:
    """``exp`` elementwise through the C library's ``exp`` (what ``math.exp`` calls).

    numpy picks its float64 ``exp`` loop by instruction set: on a CPU with AVX-512F its own
    vectorised loop, elsewhere the C library's ``exp``; the two round differently in the last
    bit, so the same data would differ between CPUs (NumPy, ``loops_exponent_log.dispatch``).
    The C library's ``exp`` is one function on every x86-64 CPU with AVX2 and FMA (glibc's
    FMA variant). One Python call per element: fine for data sets of a few million values.
    """
    x = np.asarray(x, dtype=np.float64)
    return np.asarray(_LIBM_EXP(x), dtype=np.float64).reshape(x.shape)


def piecewise_forcing(x0: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``x'' + 4x = u(t)`` with ``u`` = 0 on (0, 5], (t-5)/5 on (5, 10], 1 after; ``x'(0) = 0``.

    The ramp response from rest is ``(s - sin(2 s) / 2) / 20`` with ``s = t - 5``; the saturation at
    t = 10 subtracts the same ramp started at 10 (the paper's closed form omits that term; this is
    the solution of the equation above, checked against a numerical solve in the tests).
    """
    t = np.asarray(t, dtype=np.float64)

    def ramp(s: np.ndarray) -> np.ndarray:
        return np.where(s > 0.0, (s - 0.5 * np.sin(2.0 * s)) / 20.0, 0.0)

    forced = ramp(t - 5.0) - ramp(t - 10.0)
    return np.asarray(x0, dtype=np.float64)[:, None] * np.cos(2.0 * t)[None, :] + forced[None, :]


def integro(x0: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``x' + 2x + 5 ∫_0^t x = H(t)``: ``X(s) = (x0 s + 1) / (s² + 2s + 5)``, poles ``-1 ± 2i``.

    Real form of the inverse transform of X(s): ``e^{-t} (x0 cos 2t + (1 - x0)/2 sin 2t)``.
    """
    x0 = np.asarray(x0, dtype=np.float64)[:, None]
    t = np.asarray(t, dtype=np.float64)[None, :]
    return exp(-t) * (x0 * np.cos(2.0 * t) + 0.5 * (1.0 - x0) * np.sin(2.0 * t))


def _shifted(phase: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.asarray(t, dtype=np.float64)[None, :] + np.asarray(phase, dtype=np.float64)[:, None]


def sine(phase: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``sin(t + x0)``."""
    return np.sin(_shifted(phase, t))


def square(phase: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``2 (1 - floor((t + x0) / π) mod 2)``: values in {0, 2}, period 2π."""
    return 2.0 * (1.0 - np.mod(np.floor(_shifted(phase, t) / np.pi), 2.0))


def sawtooth(phase: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``(t + x0) / 2π - floor((t + x0) / 2π)``: rises from 0 to 1 over each period 2π."""
    u = _shifted(phase, t) / (2.0 * np.pi)
    return u - np.floor(u)


def two_sines(phase: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Clean signal of the filter toy (Appendix C): ``sin(t') + sin(2t')``, ``t' = t + x0``."""
    u = _shifted(phase, t)
    return np.sin(u) + np.sin(2.0 * u)


def high_tone(phase: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Corruption of the toy (Appendix C): ``0.5 sin(11 t')``, same shift as the clean signal."""
    return 0.5 * np.sin(11.0 * _shifted(phase, t))


def mackey_glass_first_step(
    theta: np.ndarray, t: np.ndarray, beta: float, gamma: float, n: float, tau: float
) -> np.ndarray:
    """Mackey–Glass ``y' = β y(t-τ)/(1 + y(t-τ)^n) - γ y`` for ``t <= τ`` (method of steps).

    The history is the step ``g(s) = 1[s > -θ]`` on ``[-τ, 0]`` (reference code).  For ``t <= τ``
    the delayed argument lies in the history, so the equation is linear with the known forcing
    ``β g/(1 + g^n)`` = ``β/2`` once ``t - τ > -θ`` (i.e. ``t > τ - θ``) and 0 before, from
    ``y(0) = g(0)``.  Exact solution:
    ``y = g(0) e^{-γ t} + (β / 2γ)(1 - e^{-γ (t - s)}) 1[t > s]``, ``s = τ - θ``.
    """
    theta = np.asarray(theta, dtype=np.float64)[:, None]
    t = np.asarray(t, dtype=np.float64)[None, :]
    if np.any(t > tau):
        raise ValueError("the closed form holds only while t <= tau (first method-of-steps step)")
    g_on = 1.0 / (1.0 + 1.0**n)  # g/(1 + g^n) at g = 1
    y0 = (theta > 0.0).astype(np.float64)  # g(0) = 1[0 > -θ]
    switch = tau - theta
    after = t > switch
    forced = np.where(after, (beta * g_on / gamma) * (1.0 - exp(-gamma * (t - switch))), 0.0)
    return y0 * exp(-gamma * t) + forced


def mackey_glass_history(theta: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The reference history ``g(t) = 1[t > -θ]`` for ``t <= 0``; ``[N, T]``."""
    return (np.asarray(t)[None, :] > -np.asarray(theta, dtype=np.float64)[:, None]).astype(
        np.float64
    )
