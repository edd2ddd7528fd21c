"""Generate ``pendulum.csv``: a damped, driven pendulum observed with sensor noise.

    θ'' = -γ θ' - ω0² sin θ + A cos(ωd t),   γ = 0.3, ω0 = 2, A = 0.8, ωd = 1.3

60 trajectories from seeded random (θ0, θ'0) in [-1.5, 1.5] × [-1, 1], sampled at 100 times on
[0, 10] (RK4 with 20 sub-steps per sample), plus Gaussian sensor noise of σ = 0.02 rad on θ and
0.05 rad/s on θ', rounded to 5 decimals as a logger would write them. Long form: one row per
trajectory and time. Run once: ``python examples/pendulum_lab/make_data.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

GAMMA, OMEGA0, DRIVE, OMEGA_D = 0.3, 2.0, 0.8, 1.3
N, T, END, SUBSTEPS = 60, 100, 10.0, 20


def rhs(t: float, y: np.ndarray) -> np.ndarray:
    theta, omega = y[:, 0], y[:, 1]
    accel = -GAMMA * omega - OMEGA0**2 * np.sin(theta) + DRIVE * np.cos(OMEGA_D * t)
    return np.stack([omega, accel], axis=1)


def simulate(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    t = np.linspace(0.0, END, T)
    y = np.stack([rng.uniform(-1.5, 1.5, N), rng.uniform(-1.0, 1.0, N)], axis=1)
    out = np.empty((N, T, 2))
    out[:, 0] = y
    h = (t[1] - t[0]) / SUBSTEPS
    for i in range(1, T):
        s = t[i - 1]
        for _ in range(SUBSTEPS):
            k1 = rhs(s, y)
            k2 = rhs(s + h / 2, y + h / 2 * k1)
            k3 = rhs(s + h / 2, y + h / 2 * k2)
            k4 = rhs(s + h, y + h * k3)
            y, s = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), s + h
        out[:, i] = y
    return t, out


def main() -> None:
    rng = np.random.default_rng(20220717)
    t, x = simulate(rng)
    x = x + rng.standard_normal(x.shape) * np.array([0.02, 0.05])
    rows = ["trajectory,t,theta,omega"]
    for n in range(N):
        rows += [f"{n},{t[i]:.5f},{x[n, i, 0]:.5f},{x[n, i, 1]:.5f}" for i in range(T)]
    Path(__file__).with_name("pendulum.csv").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
