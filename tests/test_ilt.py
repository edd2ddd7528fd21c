"""Tests of nlmodels.ilt against exact inverses, mpmath, gradcheck and its own contracts."""

from __future__ import annotations

import itertools
import math

import mpmath as mp
import numpy as np
import pytest
import torch

from nlmodels.ilt import ILT_ALGORITHMS, cme_parameters, get_ilt

torch.set_num_threads(1)

NAMES = ["fourier", "dehoog", "talbot", "stehfest", "cme", "euler"]
EULER_GAMMA = 0.5772156649015329

# (label, F(s), exact x(t), times): exact transform pairs of different difficulty.
GRID = torch.linspace(0.5, 6.0, 23, dtype=torch.float64)
STEP_GRID = torch.cat([torch.linspace(0.2, 0.7, 6), torch.linspace(1.5, 4.0, 6)]).double()
PAIRS = {
    "exp": (lambda s: 1 / (s + 1), lambda t: torch.exp(-t), GRID),
    "cos": (lambda s: s / (s**2 + 1), torch.cos, GRID),
    "sin": (lambda s: 1 / (s**2 + 1), torch.sin, GRID),
    "branch": (lambda s: 1 / torch.sqrt(s), lambda t: 1 / torch.sqrt(math.pi * t), GRID),
    "ramp": (lambda s: 1 / s**2, lambda t: t, GRID),
    "double_pole": (lambda s: 1 / (s + 0.5) ** 2, lambda t: t * torch.exp(-t / 2), GRID),
    "log": (lambda s: -torch.log(s) / s, lambda t: torch.log(t) + EULER_GAMMA, GRID),
    "step": (lambda s: torch.exp(-s) / s, lambda t: (t > 1).double(), STEP_GRID),
}
# Max abs error allowed per algorithm and pair, ~2-4x what each method really reaches at 33
# terms (None: the method is not applicable, see the comment). They encode each method's
# known character: de Hoog/Euler near machine precision on smooth F, FSI/CME ~1e-2..1e-3,
# Talbot exact unless x oscillates, Stehfest exact-ish for monotone x only.
TOL = {
    "fourier": dict(
        exp=3e-2, cos=5e-2, sin=3e-2, branch=1e-2, ramp=0.5, double_pole=2e-2, log=0.15, step=6e-2
    ),  # ramp/log grow: beyond FSI's assumed e^{αt} bound
    "dehoog": dict(
        exp=1e-9, cos=5e-9, sin=5e-9, branch=2e-9, ramp=1e-7, double_pole=3e-9, log=2e-8, step=5e-9
    ),
    "talbot": dict(
        exp=1e-10,
        cos=3e-5,
        sin=1e-5,
        branch=1e-9,
        ramp=1e-10,
        double_pole=1e-10,
        log=3e-10,
        step=None,
    ),  # e^{-s} overflows on Talbot's left-reaching contour
    "stehfest": dict(
        exp=5e-5, cos=None, sin=None, branch=2e-6, ramp=1e-6, double_pole=1e-4, log=2e-6, step=0.2
    ),  # real nodes cannot resolve oscillation
    "cme": dict(
        exp=3e-4, cos=2e-2, sin=1e-2, branch=5e-4, ramp=1e-6, double_pole=5e-4, log=6e-4, step=1e-4
    ),
    "euler": dict(
        exp=1e-10,
        cos=2e-10,
        sin=2e-10,
        branch=2e-10,
        ramp=2e-9,
        double_pole=2e-10,
        log=5e-10,
        step=0.15,
    ),
}
CASES = [(n, p) for n in NAMES for p in PAIRS if TOL[n][p] is not None]


def test_registry_has_every_algorithm():
    assert sorted(ILT_ALGORITHMS) == sorted(NAMES)
    for name in NAMES:
        assert get_ilt(name).name == name


@pytest.mark.parametrize(("name", "pair"), CASES)
def test_accuracy_on_exact_pairs(name, pair):
    F, x, t = PAIRS[pair]
    err = (get_ilt(name, terms=33).invert(F, t) - x(t)).abs().max().item()
    assert err < TOL[name][pair], f"{name} on {pair}: max error {err:.3e}"


def test_step_needs_points_away_from_the_jump():
    # near t = 1 the Gibbs-like error is large: the tolerance above is not vacuous
    F, x, _ = PAIRS["step"]
    t = torch.tensor([0.99, 1.01], dtype=torch.float64)
    assert (get_ilt("fourier").invert(F, t) - x(t)).abs().min() > 0.2


@pytest.mark.parametrize("name", ["fourier", "dehoog", "talbot", "euler", "cme"])
def test_against_mpmath_oracle(name):
    # transforms with no tabulated inverse here: mpmath's Talbot inversion at 30 digits decides
    mp.mp.dps = 30
    cases = [
        (lambda s: 1 / (s + torch.sqrt(s) + 1), lambda s: 1 / (s + mp.sqrt(s) + 1)),
        (lambda s: torch.atan(1 / s), lambda s: mp.atan(1 / s)),  # sin(t)/t
    ]
    tol = {"fourier": 3e-2, "cme": 1e-2, "dehoog": 1e-7, "talbot": 1e-6, "euler": 1e-7}[name]
    ts = [0.5, 1.5, 3.0]
    for F, Fmp in cases:
        oracle = torch.tensor([float(mp.invertlaplace(Fmp, v, method="talbot")) for v in ts])
        got = get_ilt(name).invert(F, torch.tensor(ts, dtype=torch.float64))
        assert (got - oracle).abs().max() < tol


def test_fourier_error_falls_with_terms():
    t = torch.linspace(0.1, 10, 200, dtype=torch.float64)
    for F, x in [(lambda s: s / (s**2 + 1), torch.cos), (lambda s: 1 / (s + 1), torch.exp)]:
        exact = x(t) if x is torch.cos else torch.exp(-t)
        rmse = [
            torch.sqrt(torch.mean((get_ilt("fourier", terms=n).invert(F, t) - exact) ** 2))
            for n in (9, 17, 33, 65, 129)
        ]
        assert all(a > b for a, b in itertools.pairwise(rmse)), rmse


def test_fourier_gamma_conventions_differ_and_reference_is_better():
    t = torch.linspace(0, 10, 1000, dtype=torch.float64)[1:]
    F = lambda s: s / (s**2 + 1)  # noqa: E731
    ref = get_ilt("fourier", gamma_convention="reference").invert(F, t) - torch.cos(t)
    paper = get_ilt("fourier", gamma_convention="paper").invert(F, t) - torch.cos(t)
    # Table 12 of the paper: 0.0171 RMSE with 33 terms
    assert torch.sqrt(torch.mean(ref**2)) < 0.0172
    assert torch.sqrt(torch.mean(ref**2)) < torch.sqrt(torch.mean(paper**2))


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_reconstruct(name):
    ilt = get_ilt(name, terms=9)
    t = torch.tensor([0.7, 1.3, 2.9], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    base = ilt.query(t)
    fs = 1 / (base + 1)  # realistic values: de Hoog's QD table divides by differences
    noise = torch.randn(fs.shape, dtype=torch.complex128, generator=g) * 0.01
    fs = (fs + noise).unsqueeze(0).expand(2, -1, -1).clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda f: ilt.reconstruct(f, t), (fs,))


@pytest.mark.parametrize("name", NAMES)
def test_batched_equals_per_item_with_per_sample_grids(name):
    ilt = get_ilt(name)
    g = torch.Generator().manual_seed(1)
    t = torch.rand(3, 1, 5, generator=g, dtype=torch.float64) * 4 + 0.2  # [B, 1, T]
    rates = torch.tensor([0.5, 1.0], dtype=torch.float64).view(1, 2, 1, 1)  # D = 2
    s = ilt.query(t)  # [B, 1, T, Q]
    fs = 1 / (s + rates)  # [B, D, T, Q]
    batched = ilt.reconstruct(fs, t)
    assert batched.shape == (3, 2, 5)
    assert batched.dtype == torch.float64
    for b in range(3):
        for d in range(2):
            single = ilt.reconstruct(fs[b, d], t[b, 0])
            torch.testing.assert_close(batched[b, d], single, rtol=1e-12, atol=1e-12)
    # and invert with [B, T] grids agrees with the exact inverse per sample
    flat = t[:, 0]
    x = ilt.invert(lambda z: 1 / (z + 1), flat)
    assert x.shape == flat.shape
    torch.testing.assert_close(x, ilt.invert(lambda z: 1 / (z + 1), flat.reshape(-1)).view(3, 5))


@pytest.mark.parametrize("name", [n for n in NAMES if n != "dehoog"])
def test_weights_equal_reconstruct(name):
    ilt = get_ilt(name)
    assert ilt.is_linear
    t = torch.tensor([[0.3, 1.0, 4.0], [0.5, 2.0, 8.0]], dtype=torch.float64)
    fs = torch.sin(ilt.query(t)) / ilt.query(t) ** 2
    w = ilt.weights(t)
    assert w.shape == fs.shape and w.dtype == torch.complex128
    # equal up to rounding of the sum (Stehfest/Euler weights alternate and cancel)
    scale = (fs * w).abs().sum(-1)
    assert ((fs * w).real.sum(-1) - ilt.reconstruct(fs, t)).abs().le(1e-14 * scale).all()


def test_dehoog_is_nonlinear_and_has_no_weights():
    ilt = get_ilt("dehoog")
    assert not ilt.is_linear
    with pytest.raises(NotImplementedError):
        ilt.weights(torch.ones(3, dtype=torch.float64))


def test_query_shapes_and_dtypes_from_float32_input():
    for name in NAMES:
        ilt = get_ilt(name, terms=33)
        s = ilt.query(torch.tensor([1.0, 2.0]))  # float32 in: promoted, never computed in 32 bit
        assert s.dtype == torch.complex128 and s.shape == (2, ilt.n_query)
    assert {n: get_ilt(n).n_query for n in NAMES} == {
        "fourier": 33,
        "dehoog": 33,
        "talbot": 16,
        "stehfest": 16,
        "cme": 33,
        "euler": 33,
    }


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: get_ilt("laplace"), "valid names"),
        (lambda: get_ilt("fourier", terms=2), "terms"),
        (lambda: get_ilt("fourier", gamma_convention="x"), "reference"),
        (lambda: get_ilt("fourier", scale=1.0), "scale"),
        (lambda: get_ilt("talbot", scale=2.0), "valid options"),
        (lambda: get_ilt("fourier").query(torch.tensor([1.0, 0.0])), "> 0"),
        (lambda: get_ilt("euler").query(torch.tensor([1.0, -2.0])), "> 0"),
        (lambda: get_ilt("cme").query(torch.tensor([1.0, float("nan")])), "finite"),
        (
            lambda: get_ilt("talbot").reconstruct(
                torch.ones(4, 5, dtype=torch.complex128), torch.ones(4)
            ),
            "query points",
        ),
        (
            lambda: get_ilt("fourier", terms=5).reconstruct(
                torch.ones(4, 5, dtype=torch.complex128), torch.ones(3)
            ),
            "broadcast",
        ),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_stehfest_weights_sum_to_zero_and_reproduce_constants():
    # Σ V_k = 0 (F = 1 has inverse δ(t), zero for t > 0) and 1/s -> 1, up to the float64
    # rounding of weights as large as ~1e9 (exact in rationals)
    ilt = get_ilt("stehfest")
    t = torch.tensor([0.5, 2.0], dtype=torch.float64)
    assert ilt.invert(lambda s: torch.ones_like(s), t).abs().max() < 2e-6
    torch.testing.assert_close(
        ilt.invert(lambda s: 1 / s, t), torch.ones(2, dtype=torch.float64), rtol=0, atol=2e-6
    )


def _cme_moments(p: dict) -> tuple[float, float, float, float]:
    """∫f, mean, cv² and min f of the shipped CME density, by dense quadrature."""
    x = np.linspace(0.0, 150.0, 300_001)
    k = np.arange(1, p["n"] + 1)[:, None]
    wx = p["omega"] * k * x
    f = np.exp(-x) * (
        p["c"]
        + (np.asarray(p["a"])[:, None] * np.cos(wx) + np.asarray(p["b"])[:, None] * np.sin(wx)).sum(
            0
        )
    )
    m = [np.trapezoid(x**j * f, x) for j in range(3)]
    return m[0], m[1] / m[0], m[2] * m[0] / m[1] ** 2 - 1, f.min() / f.max()


@pytest.mark.parametrize("order", [4, 16, 32])
def test_cme_parameters_independently_checked(order):
    p = cme_parameters()[order]
    mass, mean, cv2, neg = _cme_moments(p)
    assert mass == pytest.approx(1.0, abs=1e-6)
    assert mean == pytest.approx(p["mu1"], rel=1e-5)
    assert cv2 == pytest.approx(p["cv2"], rel=1e-3)
    assert neg > -1e-9  # a density: the cos² product form is non-negative
    if order == 32:
        assert cv2 <= 4.17e-4  # the reference package's best at this order is 4.16e-4


def test_cme_cv2_decreases_with_order():
    cv2 = [cme_parameters()[n]["cv2"] for n in (1, 2, 4, 8, 16, 32)]
    assert all(a > b for a, b in itertools.pairwise(cv2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_matches_cpu(name):
    ilt = get_ilt(name)
    t = torch.linspace(0.2, 5, 40, dtype=torch.float64).view(2, 20)
    F = lambda s: s / (s**2 + 1)  # noqa: E731
    cpu = ilt.invert(F, t)
    fs = F(ilt.query(t.cuda())).requires_grad_(True)
    gpu = ilt.reconstruct(fs, t.cuda())
    assert gpu.device.type == "cuda" and gpu.dtype == torch.float64
    # The two devices sum the terms of x(t) = Re Σ_q w_q F(s_q) in different orders (and may
    # evaluate F a few ulps apart), so they may differ by a few float64 eps of Σ_q |w_q F(s_q)|:
    # |x| times the sum's condition number, which alternating weights make large (Stehfest up to
    # ~1e11, Euler ~1e7 here; Fourier ~1e3). A wrong GPU path errs by O(|x|), far beyond it.
    allowed = 1e-12 + 1e-10 * cpu.abs()
    if ilt.is_linear:
        terms = (ilt.weights(t) * F(ilt.query(t))).abs().sum(-1)
        allowed = allowed + 4 * ilt.n_query * torch.finfo(torch.float64).eps * terms
    assert ((gpu.cpu() - cpu).abs() <= allowed).all(), (gpu.cpu() - cpu).abs().max()
    gpu.sum().backward()
    assert fs.grad is not None and torch.isfinite(torch.view_as_real(fs.grad)).all()
