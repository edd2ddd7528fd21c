"""Stiff Van der Pol (μ = 1000) by RODAS4 in element-wise numpy arithmetic: the same bytes on
every CPU.

A library stiff solver (LSODA in ``scipy.integrate.odeint``, scipy's Radau) factors its Newton
matrices through BLAS/LAPACK, whose kernels each machine's OpenBLAS picks for its CPU (Haswell,
Zen, SkylakeX ...); they round differently, so the data set's bytes depended on the machine.
Here the system is 2 × 2, so nothing needs a library: the Rosenbrock method RODAS4 (Hairer &
Wanner, *Solving Ordinary Differential Equations II*, 2nd ed., 1996, §VI.4; the coefficients
of their code ``rodas.f``) solves its linear systems by Cramer's rule, and
every operation is an IEEE-754 ``+ − × ÷`` or ``sqrt`` of numpy arrays, each correctly rounded
whatever SIMD width numpy uses. No exp, power or reduction of numpy's own (those dispatch by
CPU) is called.

Each trajectory has its own adaptive step (the relaxation jumps come at different times) but
all advance together, one step attempt per iteration over the batch; every value of a trajectory
depends on its own initial state only, so the result is independent of the batch's size and
order. Steps are clipped to land exactly on the output times. Step control as ``rodas.f``:
``h_new = h / clip(err^{1/4} / 0.9, 1/6, 5)``, no growth right after a rejected step.
"""

from __future__ import annotations

import numpy as np

MU = 1000.0
RTOL = 1e-8
ATOL = 1e-10
#: Initial step (the scale of the fast transients at μ = 1000; the controller adapts at once).
H0 = 1e-6
MAX_ITERATIONS = 2_000_000

# RODAS4 (``rodas.f``, METH = 1): stage coefficients a_ij, C_ij (transformed form) and γ.
_GAMMA = 0.25
_A = {
    2: (1.544,),
    3: (0.9466785280815826, 0.2557011698983284),
    4: (3.314825187068521, 2.896124015972201, 0.9986419139977817),
    5: (1.221224509226641, 6.019134481288629, 12.53708332932087, -0.687886036105895),
}
_C = {
    2: (-5.6688,),
    3: (-2.430093356833875, -0.2063599157091915),
    4: (-0.1073529058151375, -9.594562251023355, -20.47028614809616),
    5: (7.496443313967647, -10.24680431464352, -33.99990352819905, 11.7089089320616),
    6: (8.083246795921522, -7.981132988064893, -31.52159432874371, 16.31930543123136,
        -6.058818238834054),
}  # fmt: skip
_SAFE, _GROW, _SHRINK = 0.9, 1.0 / 6.0, 5.0


def vdp_rhs(x: np.ndarray, y: np.ndarray, mu: float = MU) -> tuple[np.ndarray, np.ndarray]:
    """``x' = y, y' = μ (1 − x²) y − x``, element-wise."""
    return y, mu * (1.0 - x * x) * y - x


def _combine(terms, coefficients):
    """``Σ c_j k_j`` over stage pairs, left to right (a fixed order of roundings)."""
    sx = sy = None
    for (kx, ky), c in zip(terms, coefficients, strict=True):
        sx = c * kx if sx is None else sx + c * kx
        sy = c * ky if sy is None else sy + c * ky
    return sx, sy


def _step(x, y, h, mu):
    """One RODAS4 step from (x, y) with steps ``h`` (arrays): the new state and the error
    estimate (the last stage)."""
    # E = I/(hγ) − J with J = [[0, 1], [−2μxy − 1, μ(1 − x²)]], solved by Cramer's rule.
    fac = 1.0 / (h * _GAMMA)
    e21 = 2.0 * mu * x * y + 1.0
    e22 = fac - mu * (1.0 - x * x)
    inv_det = 1.0 / (fac * e22 + e21)  # e11 e22 − e12 e21 with e11 = fac, e12 = −1

    def solve(rx, ry):
        return (rx * e22 + ry) * inv_det, (fac * ry - e21 * rx) * inv_det

    inv_h = 1.0 / h
    stages = [solve(*vdp_rhs(x, y, mu))]
    for i in (2, 3, 4, 5):
        dx, dy = _combine(stages, _A[i])
        fx, fy = vdp_rhs(x + dx, y + dy, mu)
        cx, cy = _combine(stages, _C[i])
        stages.append(solve(fx + cx * inv_h, fy + cy * inv_h))
    # stiffly accurate: the embedded solution is the fifth stage's point, the sixth its error
    dx, dy = _combine(stages[:4], _A[5])
    x5, y5 = x + dx + stages[4][0], y + dy + stages[4][1]
    fx, fy = vdp_rhs(x5, y5, mu)
    cx, cy = _combine(stages, _C[6])
    ex, ey = solve(fx + cx * inv_h, fy + cy * inv_h)
    return x5 + ex, y5 + ey, ex, ey


def _error_norm(x, y, xn, yn, ex, ey):
    sx = ATOL + RTOL * np.maximum(np.abs(x), np.abs(xn))
    sy = ATOL + RTOL * np.maximum(np.abs(y), np.abs(yn))
    rx, ry = ex / sx, ey / sy
    return np.sqrt((rx * rx + ry * ry) * 0.5)


def solve_vdp(z0: np.ndarray, t_phys: np.ndarray, mu: float = MU) -> np.ndarray:
    """Solve from states ``z0`` ``[N, 2]`` at t = 0 to the increasing times ``t_phys`` (> 0);
    returns ``[N, len(t_phys), 2]``."""
    z0 = np.asarray(z0, dtype=np.float64)
    t_out = np.asarray(t_phys, dtype=np.float64)
    if z0.ndim != 2 or z0.shape[1] != 2:
        raise ValueError(f"initial states must be [N, 2]; got shape {z0.shape}")
    if t_out.size and (t_out[0] <= 0.0 or np.any(np.diff(t_out) <= 0.0)):
        raise ValueError("output times must be positive and increasing")
    n, n_out = z0.shape[0], t_out.size
    out = np.empty((n, n_out, 2))
    if n == 0 or n_out == 0:
        return out
    x, y = z0[:, 0].copy(), z0[:, 1].copy()
    t = np.zeros(n)
    h = np.full(n, H0)
    nxt = np.zeros(n, dtype=np.int64)  # index of each trajectory's next output time
    rejected = np.zeros(n, dtype=bool)
    live = np.arange(n)
    for _ in range(MAX_ITERATIONS):
        target = t_out[nxt[live]]
        gap = target - t[live]
        lands = h[live] >= gap
        step = np.where(lands, gap, h[live])
        xl, yl = x[live], y[live]
        xn, yn, ex, ey = _step(xl, yl, step, mu)
        err = _error_norm(xl, yl, xn, yn, ex, ey)
        ok = err <= 1.0  # NaN (an overflowing attempt) is rejected too
        # h_new = step / clip(err^(1/4) / SAFE, 1/GROW-limit, SHRINK-limit), err = 0 allowed
        factor = np.minimum(_SHRINK, np.maximum(_GROW, np.sqrt(np.sqrt(err)) / _SAFE))
        factor = np.where(np.isnan(factor), _SHRINK, factor)
        h_new = step / factor
        h_new = np.where(ok & rejected[live], np.minimum(h_new, step), h_new)
        # a step clipped to land on an output time does not shrink the next one
        h_new = np.where(ok & lands, np.maximum(h_new, h[live]), h_new)
        acc = live[ok]
        x[acc], y[acc] = xn[ok], yn[ok]
        t[acc] = np.where(lands[ok], target[ok], t[acc] + step[ok])
        landed = live[ok & lands]
        out[landed, nxt[landed], 0], out[landed, nxt[landed], 1] = x[landed], y[landed]
        nxt[landed] += 1
        rejected[live] = ~ok
        h[live] = h_new
        if np.any(h[live] < 1e-14 * np.maximum(1.0, t[live])):
            bad = live[h[live] < 1e-14 * np.maximum(1.0, t[live])][0]
            raise RuntimeError(
                f"stiff Van der Pol solve failed for initial state {tuple(z0[bad].tolist())}: "
                f"step size underflow at t = {t[bad]:.6g}"
            )
        live = live[nxt[live] < n_out]
        if live.size == 0:
            return out
    raise RuntimeError(f"stiff Van der Pol solve did not finish in {MAX_ITERATIONS} iterations")
