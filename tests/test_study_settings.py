"""Every study's paper-profile cells are the paper's: systems × methods × levels × seeds ×
epochs of its table (paper ``Table:ablate``, ``Table:AdditionalNoiseResult``,
``Table:datascaling``, figure ``ObservationSizeScaling``, ``ILTcompar``, ``Table:AdditionalMSE``,
``nfes_analysis``, ``Table:CMI``, ``Table:toywaveforms``, ``frequencyfilter``, ``wallclocktime``),
and its published figures are the tables' own.

Each body is planned, not trained (:func:`flows.studies.plan_study`, as the results ledger
and ``benchmarks/study_projection.py`` enumerate the studies): its cells are collected and
handed back "not trained", so no cell trains and no model is loaded.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pandas as pd
import pytest

from flows.studies import plan_study

ALL = ("node", "anode", "latent_ode", "nf_coupling", "nf_resnet", "neural_laplace")
FIVE = (0, 1, 2, 3, 4)
THREE = (0, 1, 2)
ABLATE = ("lotka_volterra_dde", "stiff_van_der_pol", "piecewise_forcing_ode", "integro_de")


def _plan(name: str, profile: str = "paper") -> list:
    """The cells study ``name``'s body asks for at ``profile`` (deduplicated by config hash)."""
    plan = plan_study(name, profile)
    assert plan.stopped is None, plan.stopped  # (a measured model: nothing, while planned)
    return list(plan.cells)


def _grid(cells: list, level) -> set[tuple[Any, ...]]:
    return {(c.system, c.method, level(c), c.seed) for c in cells}


def _product(systems, methods, levels, seeds) -> set[tuple[Any, ...]]:
    return {(s, m, v, seed) for s in systems for m in methods for v in levels for seed in seeds}


def _one(cells: list, get) -> set[Any]:
    return {get(c) for c in cells}


@pytest.fixture(autouse=True)
def _no_ilt_timing(monkeypatch):
    """The ILT study's accuracy table (deterministic, 100 timing repeats at the paper's budget)
    is not what these tests pin: a stub row per algorithm stands in for it."""
    import flows.studies.ilt as ilt

    def stub(terms: int, repeats: int) -> pd.DataFrame:
        assert (terms, repeats) == (33, 100)  # Table 12: 2N + 1 = 33 terms
        row = {"value": 0.0, "std": math.nan, "n": 1, "us_per_point": 0.0}
        return pd.DataFrame([{"algorithm": a, **row} for a in ("fourier", "cme")])

    monkeypatch.setattr(ilt, "ilt_accuracy", stub)


def test_paper_seeds_by_study():
    """Tables datascaling and AdditionalNoiseResult and figure ILTcompar average 3 runs; the rest
    5 (the profile's own); explicit seeds and the smaller profiles are left alone."""
    from flows._study_catalog import STUDY_CATALOG
    from flows.studies import study_config

    three = {n for n, e in STUDY_CATALOG.items() if e.paper_seeds == THREE}
    assert three == {"noise", "sample-size", "ilt"}
    assert all(e.paper_seeds in (None, THREE) for e in STUDY_CATALOG.values())
    for name in STUDY_CATALOG:
        want = THREE if name in three else FIVE
        assert study_config(name, "paper").run.seeds == want
        assert study_config(name, "fair").run.seeds == want
    assert study_config("noise", "paper", seeds=[7]).run.seeds == (7,)
    assert study_config("noise", "quick").run.seeds == study_config("waveforms", "quick").run.seeds


def test_ablations_table5():
    stereo = _plan("stereographic")
    assert _grid(stereo, lambda c: c.model.get("stereographic", True)) == _product(
        ABLATE, ("neural_laplace",), (False, True), FIVE
    )
    latent = _plan("latent-dim")
    assert _grid(latent, lambda c: c.model.get("latent_dim", 2)) == _product(
        ABLATE, ("neural_laplace",), (1, 2, 4, 8, 16, 32), FIVE
    )
    for cells in (stereo, latent):
        assert _one(cells, lambda c: (c.training.epochs, c.data.n_trajectories)) == {(1000, 1000)}


def test_noise_table():
    """σ = 0.1 added after the z-score (statistics of every noise-free trajectory), in
    normalised units, as the reference code's ``generate_data_set`` adds it; the quick profile
    keeps its physical-unit noise (and its hashes)."""
    cells = _plan("noise")
    systems = ("lotka_volterra_dde", "integro_de", "piecewise_forcing_ode")
    assert _grid(cells, lambda c: c.data.noise_std) == _product(systems, ALL, (0.1,), THREE)
    assert _one(cells, lambda c: (c.training.epochs, c.data.n_trajectories)) == {(1000, 1000)}
    assert _one(cells, lambda c: (c.data.noise_on, c.data.normalise_on)) == {("normalised", "all")}
    assert _one(_plan("noise", "quick"), lambda c: c.data.noise_on) == {"raw"}


def test_sample_size_table():
    """N is the whole data set (split 80:10:10 as every data set), 200 epochs, 3 seeds."""
    cells = _plan("sample-size")
    sizes = (1000, 500, 250, 125, 62, 30)
    assert _grid(cells, lambda c: c.data.n_trajectories) == _product(
        ("lotka_volterra_dde",), ALL, sizes, THREE
    )
    assert _one(cells, lambda c: (c.training.epochs, c.data.n_train)) == {(200, None)}
    assert _one(cells, lambda c: c.data.fractions) == {(0.8, 0.1, 0.1)}


def test_observation_size_figure():
    cells = _plan("observation-size")
    assert _grid(cells, lambda c: c.data.n_observed) == _product(
        ("stiff_van_der_pol",), ALL, (5, 10, 25, 50, 100), FIVE
    )
    assert _one(cells, lambda c: (c.training.epochs, c.data.n_trajectories, c.data.noise_std)) == {
        (200, 1000, 0.01)
    }
    assert _one(cells, lambda c: (c.data.noise_on, c.data.normalise_on)) == {("normalised", "all")}
    assert _one(_plan("observation-size", "quick"), lambda c: c.data.noise_on) == {"raw"}


def test_ilt_training_figure():
    cells = _plan("ilt")
    assert _grid(cells, lambda c: c.model.get("ilt", "fourier")) == _product(
        ("lotka_volterra_dde",), ("neural_laplace",), ("fourier", "cme"), THREE
    )


def test_solvers_and_nfe():
    solvers = _plan("solvers")
    pairs = ("lotka_volterra_dde", "piecewise_forcing_ode")
    assert _grid(solvers, lambda c: c.model.get("solver", "–")) == _product(
        pairs, ("node", "anode"), ("euler", "dopri5"), FIVE
    ) | _product(pairs, ("neural_laplace",), ("–",), FIVE)
    nfe = _plan("nfe")
    assert _grid(nfe, lambda c: c.model.get("solver", "–")) == _product(
        ("piecewise_forcing_ode",), ("node", "anode"), ("dopri5",), FIVE
    ) | _product(("piecewise_forcing_ode",), ("neural_laplace",), ("–",), FIVE)
    for cells in (solvers, nfe):
        assert _one(cells, lambda c: c.training.epochs) == {1000}
        # dopri5 at the reference's tolerances (its odeint_adjoint call leaves torchdiffeq's
        # defaults), on the reference's NODE and ANODE; euler needs none
        assert _one(cells, lambda c: (c.model.get("solver"), c.model.get("rtol"))) <= {
            ("dopri5", 1e-7),
            ("euler", None),
            (None, None),
        }
        dopri5 = [c for c in cells if c.model.get("solver") == "dopri5"]
        assert _one(dopri5, lambda c: (c.model["atol"], c.model["start"], c.model["adjoint"])) == {
            (1e-9, "first_query", True)
        }


@pytest.mark.parametrize("profile", ["smoke", "quick"])
def test_quick_looks_keep_the_models_own_solver_tolerances(profile):
    cells = [c for c in _plan("solvers", profile) if c.model.get("solver") == "dopri5"]
    assert cells and all("rtol" not in c.model and "atol" not in c.model for c in cells)


@pytest.mark.parametrize(
    ("name", "systems"),
    [
        ("cmi", ("mackey_glass_dde", "lotka_volterra_dde", "stiff_van_der_pol")),
        ("waveforms", ("sine", "square", "sawtooth")),
    ],
)
def test_all_model_tables(name, systems):
    cells = _plan(name)
    assert _grid(cells, lambda c: c.data.noise_std) == _product(systems, ALL, (0.0,), FIVE)
    assert _one(cells, lambda c: (c.training.epochs, c.data.n_trajectories)) == {(1000, 1000)}


def test_frequency_filter():
    cells = _plan("frequency-filter")
    assert _grid(cells, lambda c: c.model.get("max_frequency")) == _product(
        ("noisy_sines",), ("neural_laplace",), (None, 3.0), FIVE
    )


def test_wallclock_variants(monkeypatch):
    """Table 11's eight rows (ANODE with dopri5 among them), 1000 Lotka–Volterra trajectories,
    timed when measured (:func:`flows.studies.study_measurements`), never while planned; the
    simulation and the timing are stubbed, the calls recorded, and Prefect's warning about a
    task's logs outside a flow is off while they run (and only then)."""
    import numpy as np
    from prefect.settings import PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW

    import flows.studies.wallclock as wc
    from flows.studies import study_measurements

    calls: list[tuple[str, str, int, int]] = []
    settings: dict[tuple[str, str], dict] = {}
    sizes: list[int] = []

    class _Data:
        x = np.ones((4, 6, 2)) + np.arange(6)[None, :, None]
        t = np.arange(6.0)

    def simulate(system, data, seed):
        assert system == "lotka_volterra_dde"
        sizes.append(data.n_trajectories)
        return _Data()

    quiet: set[str] = set()

    def timing(method, solver, model, x, t, config, seed):
        calls.append((method, solver, config.epochs, seed))
        quiet.add(PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW.value())
        settings[method, solver] = dict(model)
        return {"method": method, "solver": solver, "value": 1.0, "nfe_per_batch": 1.0}

    monkeypatch.setattr(wc, "simulate_data", simulate)
    monkeypatch.setattr(wc, "epoch_seconds", timing)
    monkeypatch.setattr(wc, "plot_bars", lambda *a, **k: None)
    assert _plan("wallclock") == [] and calls == [] and sizes == []
    (timed,) = study_measurements("wallclock").values()
    # the timing is a Prefect task, run here outside a flow: its log lines stay local, unwarned
    assert quiet == {"ignore"} and PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW.value() == "warn"
    assert timed["device"].str.startswith("CPU, ").all()  # (the rows say where they were timed)
    assert sizes == [1000]
    assert {(m, s) for m, s, _, _ in calls} == set(wc.VARIANTS) and len(wc.VARIANTS) == 8
    assert {seed for *_, seed in calls} == set(FIVE)
    assert {e for _, _, e, _ in calls} == {5}
    # each timed as the paper profile trains it: the reference's NODE and ANODE (adjoint, first
    # query, dopri5 at its tolerances), the Latent ODE's sampled prediction
    reference = {"start": "first_query", "adjoint": True}
    assert settings["node", "euler"] == {**reference, "solver": "euler"}
    assert settings["anode", "dopri5"] == {
        **reference,
        "solver": "dopri5",
        "rtol": 1e-7,
        "atol": 1e-9,
    }
    assert settings["latent_ode", "–"]["predict"] == "sample"
    assert settings["neural_laplace", "–"] == {}


def test_published_figures():
    """Every study's published figures, spot-checked against the paper's tables, one per
    method row and column, and complete (every row × column of the table)."""
    from flows.studies import STUDIES

    paper = {name: s.spec.paper for name, s in STUDIES.items()}
    assert len(paper["noise"]) == 18
    assert paper["noise"][("integro_de", "0.1", "latent_ode")] == 0.1002
    assert paper["noise"][("lotka_volterra_dde", "0.1", "nf_coupling")] == 0.6994
    assert len(paper["sample-size"]) == 36
    assert paper["sample-size"][("lotka_volterra_dde", "62", "anode")] == 0.8747
    assert paper["sample-size"][("lotka_volterra_dde", "1000", "neural_laplace")] == 0.1371
    assert len(paper["latent-dim"]) == 24
    assert paper["latent-dim"][("stiff_van_der_pol", "8")] == 0.1294
    assert paper["latent-dim"][("integro_de", "32")] == 0.0013
    assert len(paper["cmi"]) == 18
    assert paper["cmi"][("lotka_volterra_dde", "nf_coupling")] == 2.1696
    assert len(paper["waveforms"]) == 18
    assert paper["waveforms"][("sawtooth", "anode")] == 0.3001
    assert len(paper["wallclock"]) == 8
    assert paper["wallclock"][("anode", "dopri5")] == 17.23
    assert paper["solvers"][("piecewise_forcing_ode", "anode", "dopri5")] == 0.0769
    assert paper["stereographic"][("stiff_van_der_pol", "off")] == 0.1836
    assert Counter(k[-1] for k in paper["noise"]) == Counter({m: 3 for m in ALL})
