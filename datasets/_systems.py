"""The benchmark systems: metadata, time grids, initial conditions and generators.

Equations, grids and initial conditions follow the paper (Section 5, Appendix C) and, where the
two differ, its reference code (github.com/samholt/NeuralLaplace); properties follow paper Table 3
(``datasetprop``).  For ``n_points`` other than the default 200 each grid keeps its reference first
and last time and spaces ``n_points`` evenly in between (for 200 this is the reference grid up to
rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from datasets import _closed
from datasets._dde import solve_constant_history_dde
from datasets._stiff import MU, solve_vdp

PROPERTIES = frozenset({"delay", "stiff", "piecewise", "integro", "periodic", "discontinuous"})


@dataclass(frozen=True)
class SystemInfo:
    """Metadata of one benchmark system.

    Attributes:
        name: registry key.
        state_dim: D, the number of observed state dimensions.
        default_points: T used when ``n_points`` is None (200, as the paper).
        default_trajectories: N used when ``n_trajectories`` is None (1000, as the paper).
        properties: subset of ``PROPERTIES`` as in paper Table 3.
        description: the equation.
        ic_labels: meaning of each column of ``Dataset.ic``.
        grid: how the time grid ``Dataset.t`` (and ``Dataset.t_physical``) is built.
        initial_conditions: how the N initial conditions are chosen.
        source: where the system comes from: ``built-in``, or a user's data file or simulator
            (``datasets._declared``).
    """

    name: str
    state_dim: int
    default_points: int
    default_trajectories: int
    properties: frozenset[str]
    description: str
    ic_labels: tuple[str, ...]
    grid: str
    initial_conditions: str
    source: str = "built-in"


@dataclass(frozen=True)
class RawTrajectories:
    signal: np.ndarray  # [N, T, D] what is observed before Gaussian noise
    clean: np.ndarray  # [N, T, D] the noise-free target (differs from signal only for noisy_sines)
    ic: np.ndarray  # [N, k]


# (n_points) -> (t, t_physical)
_GridFn = Callable[[int], tuple[np.ndarray, np.ndarray]]
# (n, t, t_physical, rng, workers) -> RawTrajectories
_GenFn = Callable[[int, np.ndarray, np.ndarray, np.random.Generator, "int | None"], RawTrajectories]


@dataclass(frozen=True)
class SystemSpec:
    info: SystemInfo
    grid: _GridFn
    generate: _GenFn
    #: what the data depend on beyond name and grid (a data file's digest, a simulator's
    #: source); empty for the built-in systems, whose data fingerprints stay as they were
    fingerprint: str = ""


def _ref_last(a: float, b: float) -> float:
    """Last time of the reference ``linspace(a, b, 1000)[::5]``."""
    return a + (b - a) * 995.0 / 999.0


def _same(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return t, t.copy()


def _lin(a: float, b: float) -> _GridFn:
    return lambda n_points: _same(np.linspace(a, b, n_points))


def _box_ics(n: int, lo: float, hi: float, rng: np.random.Generator) -> np.ndarray:
    """Reference 31 x 31 grid of constant histories when N = 961, else N seeded uniform draws."""
    if n == 31 * 31:
        g = np.linspace(lo, hi, 31)
        a, b = np.meshgrid(g, g, indexing="ij")
        return np.stack([a.ravel(), b.ravel()], axis=1)
    return rng.uniform(lo, hi, size=(n, 2))


def _plain(signal: np.ndarray, ic: np.ndarray) -> RawTrajectories:
    return RawTrajectories(signal=signal, clean=signal, ic=ic)


# --- delay systems -------------------------------------------------------------------------------
_SPIRAL_A = np.array([[-1.0, 1.0], [-1.0, -1.0]])
_SPIRAL_TAU = 2.5
_LV_TAU = 0.1
_MG = {"beta": 0.25, "gamma": 0.1, "n": 10.0, "tau": 100.0}
_MG_SOLVE_END = 50.0


def spiral_rhs(t: float, x: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """``x' = A tanh(x(t) + x(t - τ))`` on ``[N, 2]`` arrays.

    The 2 × 2 product is written out element-wise: numpy's ``@`` calls the machine's BLAS, whose
    CPU-chosen kernels may round (FMA or not) differently."""
    a = np.tanh(x + xd)
    out = np.empty_like(a)
    for i in range(2):
        out[:, i] = _SPIRAL_A[i, 0] * a[:, 0] + _SPIRAL_A[i, 1] * a[:, 1]
    return out


def lotka_volterra_rhs(t: float, x: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """``x' = x (1 - y(t-τ)) / 2``, ``y' = -y (1 - x(t-τ)) / 2`` (reference sign)."""
    out = np.empty_like(x)
    out[:, 0] = 0.5 * x[:, 0] * (1.0 - xd[:, 1])
    out[:, 1] = -0.5 * x[:, 1] * (1.0 - xd[:, 0])
    return out


def _spiral(n, t, tp, rng, workers) -> RawTrajectories:
    ic = _box_ics(n, -2.0, 2.0, rng)
    return _plain(solve_constant_history_dde(spiral_rhs, ic, tp[0], _SPIRAL_TAU, tp), ic)


def _lotka_volterra(n, t, tp, rng, workers) -> RawTrajectories:
    ic = _box_ics(n, 0.1, 2.0, rng)
    return _plain(solve_constant_history_dde(lotka_volterra_rhs, ic, tp[0], _LV_TAU, tp), ic)


def _mg_grid(n_points: int) -> tuple[np.ndarray, np.ndarray]:
    # Reference: 1000 history + 1000 solution points, every 10th kept; generalised to T//2 history
    # points (the observed half is the history) and T - T//2 solution points.
    n_hist = n_points // 2
    n_sol = n_points - n_hist
    tp = np.concatenate(
        [
            np.linspace(-_MG["tau"], 0.0, 10 * n_hist)[::10],
            np.linspace(0.0, _MG_SOLVE_END, 10 * n_sol)[::10],
        ]
    )
    return np.linspace(0.1, 20.0, n_points), tp


def _mackey_glass(n, t, tp, rng, workers) -> RawTrajectories:
    theta = np.linspace(_MG["tau"], 0.0, n)
    n_hist = t.size // 2
    hist = _closed.mackey_glass_history(theta, tp[:n_hist])
    sol = _closed.mackey_glass_first_step(theta, tp[n_hist:], **_MG)
    return _plain(np.concatenate([hist, sol], axis=1)[..., None], theta[:, None])


# --- ODEs and closed forms -----------------------------------------------------------------------
def _vdp_grid(n_points: int) -> tuple[np.ndarray, np.ndarray]:
    tp = np.linspace(20.0, 4000.0, n_points)
    return tp / 200.0, tp


def _vdp(n, t, tp, rng, workers) -> RawTrajectories:
    ic = np.stack([np.linspace(0.1, 2.0, n), np.zeros(n)], axis=1)
    return _plain(solve_vdp(ic, tp, MU), ic)


def _piecewise(n, t, tp, rng, workers) -> RawTrajectories:
    x0 = np.linspace(0.0, 0.1, n)
    return _plain(_closed.piecewise_forcing(x0, tp)[..., None], np.stack([x0, np.zeros(n)], 1))


def _integro(n, t, tp, rng, workers) -> RawTrajectories:
    x0 = np.linspace(0.0, 1.0, n)
    return _plain(_closed.integro(x0, tp)[..., None], x0[:, None])


def _waveform(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> _GenFn:
    def gen(n, t, tp, rng, workers) -> RawTrajectories:
        phase = np.linspace(0.0, 2.0 * np.pi, n)
        return _plain(fn(phase, tp)[..., None], phase[:, None])

    return gen


def _noisy_sines(n, t, tp, rng, workers) -> RawTrajectories:
    phase = np.linspace(0.0, 2.0 * np.pi, n)
    clean = _closed.two_sines(phase, tp)
    signal = clean + _closed.high_tone(phase, tp)
    return RawTrajectories(signal=signal[..., None], clean=clean[..., None], ic=phase[:, None])


def _info(name, dim, props, desc, ic_labels, grid, ics) -> SystemInfo:
    assert frozenset(props) <= PROPERTIES
    return SystemInfo(name, dim, 200, 1000, frozenset(props), desc, tuple(ic_labels), grid, ics)


_DELAY = ("delay", "piecewise", "discontinuous")
_PHASES = "phase x0 = linspace(0, 2π, N)"
_WAVE_GRID = "t = linspace(0.1, 20, T)"

SYSTEM_SPECS: dict[str, SystemSpec] = {
    s.info.name: s
    for s in [
        SystemSpec(
            _info(
                "spiral_dde",
                2,
                _DELAY,
                "x' = A tanh(x(t) + x(t-τ)), A = [[-1, 1], [-1, -1]], τ = 2.5",
                ("x_history", "y_history"),
                "t = linspace(0.02, 19.92, T) (reference linspace(0.02, 20, 1000)[::5]); "
                "constant history x(t) = x0 for t <= 0.02",
                "N = 961: reference 31x31 grid over [-2, 2]^2; otherwise N seeded uniform draws "
                "from [-2, 2]^2",
            ),
            lambda T: _same(np.linspace(0.02, _ref_last(0.02, 20.0), T)),
            _spiral,
        ),
        SystemSpec(
            _info(
                "lotka_volterra_dde",
                2,
                _DELAY,
                "x' = x (1 - y(t-τ)) / 2, y' = -y (1 - x(t-τ)) / 2, τ = 0.1",
                ("x_history", "y_history"),
                "t = linspace(2, 29.888, T) (reference linspace(2, 30, 1000)[::5]); "
                "constant history for t <= 2",
                "N = 961: reference 31x31 grid over [0.1, 2]^2; otherwise N seeded uniform draws "
                "from [0.1, 2]^2",
            ),
            lambda T: _same(np.linspace(2.0, _ref_last(2.0, 30.0), T)),
            _lotka_volterra,
        ),
        SystemSpec(
            _info(
                "mackey_glass_dde",
                1,
                _DELAY,
                "y' = β y(t-τ)/(1 + y(t-τ)^n) - γ y, β = 0.25, γ = 0.1, n = 10, τ = 100; "
                "history g(t) = 1[t > -θ] on [-100, 0], solved on [0, 50]",
                ("theta",),
                "t = linspace(0.1, 20, T) relabels t_physical = linspace(-100, 0, 10 (T//2))[::10] "
                "(history) followed by linspace(0, 50, 10 (T - T//2))[::10] (solution)",
                "switch point θ = linspace(100, 0, N)",
            ),
            _mg_grid,
            _mackey_glass,
        ),
        SystemSpec(
            _info(
                "stiff_van_der_pol",
                2,
                ("discontinuous", "stiff", "periodic"),
                "x' = y, y' = μ (1 - x²) y - x, μ = 1000",
                ("x0", "y0"),
                "t_physical = linspace(20, 4000, T) from t = 0, t = t_physical / 200",
                "x(0) = linspace(0.1, 2, N), y(0) = 0",
            ),
            _vdp_grid,
            _vdp,
        ),
        SystemSpec(
            _info(
                "piecewise_forcing_ode",
                1,
                ("piecewise",),
                "x'' + 4x = u(t), u = 0 on (0, 5], (t-5)/5 on (5, 10], 1 after 10; x'(0) = 0",
                ("x0", "v0"),
                "t = linspace(0.1, 20, T)",
                "x(0) = linspace(0, 0.1, N)",
            ),
            _lin(0.1, 20.0),
            _piecewise,
        ),
        SystemSpec(
            _info(
                "integro_de",
                1,
                ("integro",),
                "x' + 2x + 5 ∫_0^t x dτ = H(t)",
                ("x0",),
                "t = linspace(0.02, 4, T)",
                "x(0) = linspace(0, 1, N)",
            ),
            _lin(0.02, 4.0),
            _integro,
        ),
        SystemSpec(
            _info("sine", 1, ("periodic",), "x = sin(t + x0)", ("phase",), _WAVE_GRID, _PHASES),
            _lin(0.1, 20.0),
            _waveform(_closed.sine),
        ),
        SystemSpec(
            _info(
                "square",
                1,
                ("periodic", "discontinuous"),
                "x = 2 (1 - floor((t + x0)/π) mod 2)",
                ("phase",),
                _WAVE_GRID,
                _PHASES,
            ),
            _lin(0.1, 20.0),
            _waveform(_closed.square),
        ),
        SystemSpec(
            _info(
                "sawtooth",
                1,
                ("periodic", "discontinuous"),
                "x = (t + x0)/2π - floor((t + x0)/2π)",
                ("phase",),
                _WAVE_GRID,
                _PHASES,
            ),
            _lin(0.1, 20.0),
            _waveform(_closed.sawtooth),
        ),
        SystemSpec(
            _info(
                "noisy_sines",
                1,
                ("periodic",),
                "x = sin t' + sin 2t' + 0.5 sin 11t', t' = t + x0 (Appendix C); "
                "x_clean = sin t' + sin 2t'",
                ("phase",),
                _WAVE_GRID + " (step ~0.1, ~5.7 samples per period of sin 11t)",
                _PHASES,
            ),
            _lin(0.1, 20.0),
            _noisy_sines,
        ),
    ]
}

#: The built-in systems, by name (a declared system never takes one of these names).
BUILTIN_SYSTEMS: frozenset[str] = frozenset(SYSTEM_SPECS)
_INFOS: dict[str, SystemInfo] = {n: s.info for n, s in SYSTEM_SPECS.items()}

#: Read-only registry of the benchmark systems, by name: the built-in ones and those declared in
#: this process from a data file or a simulator (:mod:`datasets._declared`).
SYSTEMS: Mapping[str, SystemInfo] = MappingProxyType(_INFOS)


def register_system(system: SystemSpec) -> None:
    """Add (or replace) a declared system; a built-in name is refused."""
    name = system.info.name
    if name in BUILTIN_SYSTEMS:
        raise ValueError(f"{name!r} is a built-in system; declare yours under another name")
    SYSTEM_SPECS[name] = system
    _INFOS[name] = system.info
