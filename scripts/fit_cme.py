"""Fit the CME (concentrated matrix-exponential) ILT parameters and write them as JSON.

Method (Horváth, Horváth, Almousa & Telek, "Numerical inverse Laplace transformation using
concentrated matrix exponential distributions", Performance Evaluation 2020): the CME density
of order n is

    f(x) = e^{-x} · Π_{i=1}^{n} cos²((ωx − φ_i)/2) / I₀,

a non-negative matrix-exponential density. Each factor is (1 + cos(ωx − φ_i))/2, so the product
is a trigonometric polynomial Σ_{k=−n}^{n} p_k e^{ikωx}; its coefficients follow from a DFT of
the pointwise product (exact for degree n, and stable where expanding the product is not).
All moments are then closed form,
∫ x^j e^{−x} e^{ikωx} dx = j!/(1 − ikω)^{j+1}, and so is the squared coefficient of variation
cv² = m₂/m₁² − 1, which this script minimises over (φ, ω) with L-BFGS-B (float64, exact
gradients by autograd) from several seeded starts plus a continuation from the previous order.

Output per order n (n + 1 query points): ω, μ₁ = m₁, c = p₀/I₀, a_k = 2 Re p_k/I₀,
b_k = −2 Im p_k/I₀, so that f(x) = e^{−x}[c + Σ_k a_k cos(kωx) + b_k sin(kωx)] and the ILT
nodes/weights are β₀ = μ₁, β_k = μ₁(1 + ikω), η₀ = cμ₁, η_k = μ₁(a_k + i b_k).

Usage: python scripts/fit_cme.py [--max-order 64] [--starts 8] [--seed 0] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "nlmodels" / "ilt" / "data" / "cme_params.json"
# ω is searched in a wide bracket around the values that turn out optimal (≈ 0.3 – 1.5).
LOG_OMEGA_BOUNDS = (math.log(0.02), math.log(4.0))


def trig_coefficients(phi: torch.Tensor) -> torch.Tensor:
    """Coefficients p_{−n..n} of g(θ) = Π_i 4cos²((θ − φ_i)/2) in powers of e^{iθ}.

    Sampled at L = 2n + 2 equispaced θ and transformed by a DFT, which is exact for a
    trigonometric polynomial of degree n. Pointwise products keep full relative accuracy;
    multiplying the factors' coefficient lists instead loses everything to cancellation at
    high orders (g is ~4^{-n} times its partial products). The factor 4 keeps g of order one.
    """
    n = phi.shape[0]
    size = 2 * n + 2
    theta = torch.arange(size, dtype=torch.float64) * (2 * math.pi / size)
    g = (4.0 * torch.cos((theta.unsqueeze(-1) - phi) / 2) ** 2).prod(-1)
    # (1/L) Σ_m g(θ_m) e^{−ikθ_m} is the coefficient of e^{+ikθ}, stored at index k mod L
    c = torch.fft.fft(g.to(torch.complex128)) / size
    return torch.cat([c[size - n :], c[: n + 1]])


def moments(phi: torch.Tensor, omega: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(p, I₀, m₁, m₂) of the unnormalised CME density e^{−x} Σ p_k e^{ikωx}."""
    p = trig_coefficients(phi)
    n = phi.shape[0]
    k = torch.arange(-n, n + 1, dtype=torch.float64)
    den = 1.0 - 1j * k * omega
    i0 = (p / den).sum().real
    m1 = (p / den**2).sum().real / i0
    m2 = 2.0 * (p / den**3).sum().real / i0
    return p, i0, m1, m2


def cv2_of(x: np.ndarray) -> float:
    _, _, m1, m2 = moments(torch.as_tensor(x[:-1]), torch.as_tensor(math.exp(x[-1])))
    return float(m2 / m1**2 - 1.0)


def _objective(x: np.ndarray) -> tuple[float, np.ndarray]:
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    _, _, m1, m2 = moments(xt[:-1], torch.exp(xt[-1]))
    cv2 = m2 / m1**2 - 1.0
    if not torch.isfinite(cv2) or cv2 <= 0:  # numerically degenerate corner: push away
        return 1e3, np.zeros_like(x)
    value = torch.log(cv2)  # log scale: cv² spans orders of magnitude across orders
    value.backward()
    return float(value.detach()), xt.grad.numpy().copy()


def _local_fit(x0: np.ndarray) -> np.ndarray:
    n = x0.shape[0] - 1
    res = minimize(
        _objective,
        x0,
        jac=True,
        method="L-BFGS-B",
        bounds=[(None, None)] * n + [LOG_OMEGA_BOUNDS],
        options={"maxiter": 20000, "maxfun": 40000, "ftol": 1e-15, "gtol": 1e-11},
    )
    return res.x


def fit_order(n: int, starts: int, rng: np.random.Generator, warm: np.ndarray | None) -> np.ndarray:
    """Best (φ_1..φ_n, log ω) found for order n."""
    candidates = []
    if warm is not None:
        # continuation: previous optimum plus one new zero placed in the gap next to the peak
        candidates.append(np.r_[warm[:-1], np.pi, warm[-1]])
    for _ in range(starts):
        # zeros spread over one period, leaving a gap where the density concentrates
        phi = np.pi * (2.0 * np.arange(1, n + 1) / (n + 1) - 1.0) + 0.05 * rng.standard_normal(n)
        omega = rng.uniform(0.3, 1.0) if n > 2 else rng.uniform(0.5, 2.0)
        candidates.append(np.r_[phi, math.log(omega)])
    best, best_cv2 = None, math.inf
    for x0 in candidates:
        x = _local_fit(x0)
        value = cv2_of(x)
        if 0 < value < best_cv2:
            best, best_cv2 = x, value
    assert best is not None
    return best


def parameters(x: np.ndarray) -> dict:
    """The shipped record of one order: ILT coefficients and the moments they came from."""
    n = x.shape[0] - 1
    omega = math.exp(x[-1])
    with torch.no_grad():
        p, i0, m1, m2 = moments(torch.as_tensor(x[:-1]), torch.as_tensor(omega))
    p = p.numpy() / float(i0)
    pos = p[n + 1 :]  # k = 1..n
    return {
        "n": n,
        "omega": omega,
        "mu1": float(m1),
        "cv2": float(m2 / m1**2 - 1.0),
        "c": float(p[n].real),
        "a": (2.0 * pos.real).tolist(),
        "b": (-2.0 * pos.imag).tolist(),
        "phi": [float(v) for v in np.mod(x[:-1], 2 * np.pi)],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-order", type=int, default=64)
    parser.add_argument("--starts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    records, warm = [], None
    for n in range(1, args.max_order + 1):
        t0 = time.perf_counter()
        warm = fit_order(n, args.starts, rng, warm)
        rec = parameters(warm)
        records.append(rec)
        print(
            f"order {n:3d}: cv2 = {rec['cv2']:.4e}  mu1 = {rec['mu1']:.4f}  "
            f"omega = {rec['omega']:.5f}  ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    payload = {
        "method": "CME ILT parameters by scripts/fit_cme.py (min cv^2 over phases and omega)",
        "seed": args.seed,
        "starts": args.starts,
        "orders": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {len(records)} orders to {args.out}")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
