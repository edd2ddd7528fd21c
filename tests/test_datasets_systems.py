"""Simulators against independent oracles: analytic solutions and tight scipy solves."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import signal
from scipy.integrate import solve_ivp

from datasets import PROPERTIES, SYSTEMS, simulate, solve_constant_history_dde, solve_vdp

TIGHT = {"method": "DOP853", "rtol": 1e-12, "atol": 1e-12}


# Right-hand sides written out again from the paper's equations (not imported), so that a wrong
# sign or constant in the package cannot hide in its own oracle.  Batched [1, D] in, [1, D] out.
def spiral_rhs(t, x, xd):
    a = np.tanh(x[0] + xd[0])
    return np.array([[-a[0] + a[1], -a[0] - a[1]]])


def lotka_volterra_rhs(t, x, xd):
    return np.array([[0.5 * x[0, 0] * (1 - xd[0, 1]), -0.5 * x[0, 1] * (1 - xd[0, 0])]])


def vdp_rhs(t, z):
    return [z[1], 1000.0 * (1 - z[0] ** 2) * z[1] - z[0]]


def vdp_jac(t, z):
    return [[0.0, 1.0], [-2000.0 * z[0] * z[1] - 1, 1000.0 * (1 - z[0] ** 2)]]


# --- registry -------------------------------------------------------------------------------------
def test_registry_matches_paper_table_3():
    assert set(SYSTEMS) == {
        "spiral_dde",
        "lotka_volterra_dde",
        "mackey_glass_dde",
        "stiff_van_der_pol",
        "piecewise_forcing_ode",
        "integro_de",
        "sine",
        "square",
        "sawtooth",
        "noisy_sines",
    }
    table3 = {  # paper Table 3: piecewise, discontinuous, integro, delay, stiff, periodic
        "spiral_dde": {"piecewise", "discontinuous", "delay"},
        "lotka_volterra_dde": {"piecewise", "discontinuous", "delay"},
        "mackey_glass_dde": {"piecewise", "discontinuous", "delay"},
        "stiff_van_der_pol": {"discontinuous", "stiff", "periodic"},
        "piecewise_forcing_ode": {"piecewise"},
        "integro_de": {"integro"},
    }
    for name, props in table3.items():
        assert SYSTEMS[name].properties == props, name
    for name, info in SYSTEMS.items():
        assert info.name == name and info.properties <= PROPERTIES
        assert info.default_points == 200 and info.default_trajectories == 1000


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_shapes_dtypes_and_exact_count(name):
    n = 3 if name == "stiff_van_der_pol" else 7
    ds = simulate(name, n_trajectories=n, n_points=10, seed=1)
    info = SYSTEMS[name]
    assert ds.x.shape == ds.x_clean.shape == (n, 10, info.state_dim)
    assert ds.t.shape == ds.t_physical.shape == (10,)
    assert ds.ic.shape == (n, len(info.ic_labels))
    for a in (ds.t, ds.x, ds.x_clean, ds.ic, ds.t_physical):
        assert a.dtype == np.float64 and not a.flags.writeable and np.all(np.isfinite(a))
    assert np.all(np.diff(ds.t) > 0)
    assert (ds.n_trajectories, ds.n_points, ds.state_dim) == (n, 10, info.state_dim)


@pytest.mark.parametrize("name", ["spiral_dde", "lotka_volterra_dde", "sine", "integro_de"])
def test_default_grid_is_the_reference_grid(name):
    ds = simulate(name, n_trajectories=1)
    ref = {
        "spiral_dde": np.linspace(0.02, 20, 1000)[::5],
        "lotka_volterra_dde": np.linspace(2, 30, 1000)[::5],
        "sine": np.linspace(0.1, 20, 200),
        "integro_de": np.linspace(0.02, 4, 200),
    }[name]
    np.testing.assert_allclose(ds.t, ref, rtol=0, atol=1e-12)


# --- the generic delay integrator -----------------------------------------------------------------
def test_method_of_steps_matches_exact_piecewise_polynomial():
    # x'(t) = -x(t - 1), x = c for t <= t0: exact solution on the first three delay intervals.
    t0 = 0.3
    c = np.array([[1.0], [-2.0], [0.5]])
    t = np.linspace(t0, t0 + 3.0, 61)
    x = solve_constant_history_dde(lambda _t, _x, xd: -xd, c, t0, 1.0, t, max_step=0.05)
    s = t - t0
    exact = np.where(
        s <= 1,
        1 - s,
        np.where(s <= 2, 1 - s + (s - 1) ** 2 / 2, 1 - s + (s - 1) ** 2 / 2 - (s - 2) ** 3 / 6),
    )
    np.testing.assert_allclose(x[..., 0], c * exact[None, :], atol=1e-12)


def _reference_dde(rhs, history, t0, tau, t_eval):
    """Independent method of steps: DOP853 per delay interval, delayed values by dense output."""
    segments = []

    def delayed(t):
        s = t - tau
        if s <= t0 or not segments:  # (rounding can put s a hair past a segment end)
            return history
        k = min(int((s - t0) // tau), len(segments) - 1)
        return segments[k](s)

    y, a, t_end = history, t0, t_eval[-1]
    while a < t_end - 1e-12:
        b = min(a + tau, t_end)
        sol = solve_ivp(
            lambda t, z: rhs(t, z[None], delayed(t)[None])[0], (a, b), y, dense_output=True, **TIGHT
        )
        segments.append(sol.sol)
        y, a = sol.y[:, -1], b
    out = [
        history if s <= t0 else segments[min(int((s - t0) // tau), len(segments) - 1)](s)
        for s in t_eval
    ]
    return np.array(out)


@pytest.mark.parametrize(
    ("name", "rhs", "tau", "n"),
    [("spiral_dde", spiral_rhs, 2.5, 4), ("lotka_volterra_dde", lotka_volterra_rhs, 0.1, 2)],
)
def test_delay_systems_match_independent_reference(name, rhs, tau, n):
    ds = simulate(name, n_trajectories=n, seed=3)
    for i in range(n):
        ref = _reference_dde(rhs, ds.ic[i], ds.t_physical[0], tau, ds.t_physical)
        err = np.max(np.abs(ds.x[i] - ref))
        assert err <= 1e-5, (name, i, err)  # a tenth of the 1e-4 accuracy the benchmark needs


def test_spiral_reference_grid_of_histories():
    ds = simulate("spiral_dde", n_trajectories=961, n_points=4)
    g = np.linspace(-2, 2, 31)
    assert {tuple(r) for r in ds.ic} == {(a, b) for a in g for b in g}
    np.testing.assert_array_equal(ds.x[:, 0], ds.ic)  # the solution starts at its history


# --- Mackey–Glass ---------------------------------------------------------------------------------
def _mg_reference(theta, t_eval):
    beta, gamma, n, tau = 0.25, 0.1, 10.0, 100.0

    def g(s):
        return 1.0 if s > -theta else 0.0

    def rhs(t, y):
        yd = g(t - tau)
        return [beta * yd / (1 + yd**n) - gamma * y[0]]

    # integrate piecewise across the history's jump (at t = tau - theta) so that the solver never
    # steps over it
    cut = [0.0, *([tau - theta] if 0 < tau - theta < t_eval[-1] else []), t_eval[-1]]
    y, out = [g(0.0)], np.empty_like(t_eval)
    for a, b in itertools.pairwise(cut):
        sel = (t_eval >= a) & (t_eval <= b)
        sol = solve_ivp(rhs, (a, b), y, t_eval=t_eval[sel], dense_output=True, **TIGHT)
        out[sel] = sol.y[0]
        y = sol.sol(b)
    return out


def test_mackey_glass_matches_numerical_solve_and_history():
    ds = simulate("mackey_glass_dde", n_trajectories=9)
    np.testing.assert_allclose(ds.ic[:, 0], np.linspace(100, 0, 9))
    half = ds.n_points // 2
    hist_t, sol_t = ds.t_physical[:half], ds.t_physical[half:]
    np.testing.assert_allclose(hist_t, np.linspace(-100, 0, 1000)[::10])
    np.testing.assert_allclose(sol_t, np.linspace(0, 50, 1000)[::10])
    for i, theta in enumerate(ds.ic[:, 0]):
        np.testing.assert_array_equal(ds.x[i, :half, 0], (hist_t > -theta).astype(float))
        ref = _mg_reference(theta, sol_t)
        np.testing.assert_allclose(ds.x[i, half:, 0], ref, atol=1e-9)


def test_mackey_glass_equal_recent_history_diverges():
    # θ = 80 and θ = 60: identical history on (-60, 0] (the recent past), different before
    ds = simulate("mackey_glass_dde", n_trajectories=6)  # θ = 100, 80, 60, 40, 20, 0
    half = ds.n_points // 2
    a, b = ds.x[1, :, 0], ds.x[2, :, 0]
    recent = ds.t_physical[:half] > -60
    np.testing.assert_array_equal(a[:half][recent], b[:half][recent])
    assert np.any(a[:half][~recent] != b[:half][~recent])
    assert np.max(np.abs(a[half:] - b[half:])) > 0.1
    # but with θ <= 50 the switch lies beyond the solve window: same solution
    np.testing.assert_allclose(ds.x[3, half:], ds.x[4, half:])


# --- stiff Van der Pol ----------------------------------------------------------------------------
@pytest.mark.simulation
def test_stiff_van_der_pol_matches_radau():
    ds = simulate("stiff_van_der_pol", n_trajectories=2, n_points=40)
    np.testing.assert_allclose(ds.t, ds.t_physical / 200)
    for i in range(2):
        sol = solve_ivp(
            vdp_rhs,
            (0, ds.t_physical[-1]),
            ds.ic[i],
            method="Radau",
            jac=vdp_jac,
            rtol=1e-9,
            atol=1e-11,
            t_eval=ds.t_physical,
        )
        err = np.abs(ds.x[i] - sol.y.T)
        # jump times are sensitive: the median, plus a loose max
        assert np.median(err) < 1e-5 and err.max() < 1e-2, (np.median(err), err.max())


def test_stiff_van_der_pol_independent_of_batch():
    """Each trajectory's bytes depend on its own initial state only (element-wise arithmetic,
    own step sizes): a subset, in another order, solves to the same bits."""
    z0 = np.stack([np.linspace(0.1, 2.0, 9), np.linspace(-0.5, 0.5, 9)], axis=1)
    tp = np.linspace(20.0, 800.0, 12)
    whole = solve_vdp(z0, tp)
    part = solve_vdp(z0[[7, 2, 4]], tp)
    np.testing.assert_array_equal(part, whole[[7, 2, 4]])


def test_stiff_van_der_pol_refuses_bad_times():
    with pytest.raises(ValueError, match="increasing"):
        solve_vdp(np.zeros((1, 2)) + 1.0, np.array([3.0, 2.0]))


# --- closed forms ---------------------------------------------------------------------------------
def test_piecewise_forcing_matches_numerical_solve():
    ds = simulate("piecewise_forcing_ode", n_trajectories=3)

    def u(t):
        return 0.0 if t <= 5 else ((t - 5) / 5 if t <= 10 else 1.0)

    t = ds.t_physical
    for i, (x0, v0) in enumerate(ds.ic):
        y, out = [x0, v0], np.empty_like(t)
        for a, b in [(0.0, 5.0), (5.0, 10.0), (10.0, t[-1])]:  # breaks at the kinks of u
            sel = (t >= a) & (t <= b)
            sol = solve_ivp(
                lambda s, z: [z[1], u(s) - 4 * z[0]],
                (a, b),
                y,
                t_eval=t[sel],
                dense_output=True,
                **TIGHT,
            )
            out[sel] = sol.y[0]
            y = sol.sol(b)
        np.testing.assert_allclose(ds.x[i, :, 0], out, atol=1e-9)


def test_integro_matches_numerical_solve_and_spec_complex_form():
    ds = simulate("integro_de", n_trajectories=4)
    t = ds.t_physical
    for i, (x0,) in enumerate(ds.ic):
        # z = ∫x turns the IDE into the ODE x' = 1 - 2x - 5z, z' = x
        sol = solve_ivp(
            lambda s, w: [1 - 2 * w[0] - 5 * w[1], w[0]], (0, t[-1]), [x0, 0.0], t_eval=t, **TIGHT
        )
        np.testing.assert_allclose(ds.x[i, :, 0], sol.y[0], atol=1e-10)
        spec = 0.25 * np.real(
            np.exp((-1 - 2j) * t)
            * ((2 * x0 + (x0 - 1) * 1j) * np.exp(4j * t) + (2 * x0 - (x0 - 1) * 1j))
        )
        np.testing.assert_allclose(ds.x[i, :, 0], spec, atol=1e-13)


def test_waveforms_against_scipy_and_ode():
    n = 5
    phase = np.linspace(0, 2 * np.pi, n)[:, None]
    sq = simulate("square", n_trajectories=n)
    u = sq.t[None, :] + phase
    on_edge = np.isclose(np.mod(u, np.pi), 0, atol=1e-9) | np.isclose(np.mod(u, np.pi), np.pi)
    np.testing.assert_array_equal(sq.x[..., 0][~on_edge], (1 + signal.square(u))[~on_edge])
    saw = simulate("sawtooth", n_trajectories=n)
    np.testing.assert_allclose(saw.x[..., 0], (signal.sawtooth(u) + 1) / 2, atol=1e-12)
    sine = simulate("sine", n_trajectories=n)
    for i in range(n):  # sin(t + x0) solves x'' = -x
        p = phase[i, 0]
        sol = solve_ivp(
            lambda _t, z: [z[1], -z[0]],
            (0, sine.t[-1]),
            [np.sin(p), np.cos(p)],
            t_eval=sine.t,
            **TIGHT,
        )
        np.testing.assert_allclose(sine.x[i, :, 0], sol.y[0], atol=1e-9)


def test_noisy_sines_clean_and_corrupted():
    ds = simulate("noisy_sines", n_trajectories=3)
    tp = ds.t_physical[None, :] + ds.ic
    np.testing.assert_allclose(ds.x_clean[..., 0], np.sin(tp) + np.sin(2 * tp), atol=1e-13)
    np.testing.assert_allclose(ds.x[..., 0] - ds.x_clean[..., 0], 0.5 * np.sin(11 * tp), atol=1e-13)
    # the sampling resolves the 11 rad/s tone (Nyquist π/Δt > 11)
    assert np.pi / np.diff(ds.t).max() > 11


# --- full size --------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "rhs", "tau"),
    [("spiral_dde", spiral_rhs, 2.5), ("lotka_volterra_dde", lotka_volterra_rhs, 0.1)],
)
def test_delay_systems_full_size_accuracy(name, rhs, tau):
    ds = simulate(name)  # N = 1000; check a seeded spread of 12 rows
    rows = np.random.default_rng(0).choice(ds.n_trajectories, 12, replace=False)
    for i in rows:
        ref = _reference_dde(rhs, ds.ic[i], ds.t_physical[0], tau, ds.t_physical)
        assert np.max(np.abs(ds.x[i] - ref)) <= 1e-5


@pytest.mark.slow
def test_stiff_van_der_pol_full_size_against_tight_radau():
    ds = simulate("stiff_van_der_pol")
    for i in (0, 333, 999):
        sol = solve_ivp(
            vdp_rhs,
            (0, 4000),
            ds.ic[i],
            method="Radau",
            jac=vdp_jac,
            rtol=1e-11,
            atol=1e-13,
            t_eval=ds.t_physical,
        )
        err = np.abs(ds.x[i] - sol.y.T)
        assert np.median(err) < 1e-6 and err.max() < 1e-3
