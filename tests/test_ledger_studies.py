"""The paper's other tables in the results ledger: each study's cells as its own body plans them,
tagged with how they differ from the profile's cell, trained by the ledger's groups (whose
configs must make exactly those cells), counted by config hash (a study cell that is a Table 3
cell shares its record), and drawn back into the study's table from the records."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest
from cells import ledger_record as _record

from flows.cli import main
from flows.ledger.groups import LedgerGroup
from flows.ledger.plan import group_config, ledger_groups, to_train
from flows.studies import LEDGER_STUDIES, ledger_study_cells, planned_cells, recorded_output
from tasks.config import CellConfig
from tasks.ledger import LedgerCell, LedgerRecord, LedgerScope, cell_states, read_ledger
from tasks.ledger.measured import MAX_CURVE_POINTS, Measured, downsample
from tasks.ledger.scope import paper_config
from tasks.ledger.variants import variant_of, variant_overrides


def _base(cell: CellConfig, profile: str = "paper") -> CellConfig:
    config = paper_config(profile=profile, systems=[cell.system], methods=[cell.method])
    return next(c for c in config.cells() if c.seed == cell.seed)


@pytest.fixture(scope="module")
def paper_cells() -> list[tuple[str, str, CellConfig]]:
    return ledger_study_cells("paper")


@pytest.mark.parametrize("profile", ["paper", "fair"])
def test_every_study_cell_is_made_again_by_the_group_that_trains_it(profile, paper_cells):
    """The construction the ledger rests on, checked on every cell of every study (none was
    written down here): the variant that tags a cell, read back into config layers over the
    profile, makes the cell with its config hash, so ``ledger run`` trains the very cell the
    study's table needs (and refuses to train otherwise: ``_same_cells``)."""
    planned = paper_cells if profile == "paper" else ledger_study_cells(profile)
    assert {s for s, _, _ in planned} == set(LEDGER_STUDIES) - {"wallclock"}  # (timed only)
    bases: dict[tuple[str, str, int], CellConfig] = {}
    for study, _, cell in planned:
        key = (cell.system, cell.method, cell.seed)
        if key not in bases:
            bases[key] = _base(cell, profile)
        variant = variant_of(cell, bases[key])
        group = LedgerGroup(cell.method, variant, (cell.seed,), (cell.system,), study)
        (made,) = group_config(group, {"profile": profile}, {}).cells()
        assert made.config_hash() == cell.config_hash(), (study, cell.key, variant)
        # "" exactly when it is the profile's own cell
        assert (variant == "") == (cell.config_hash() == bases[key].config_hash())


def test_a_variant_names_what_differs_and_reads_back():
    base = paper_config(systems=["integro_de"], methods=["node"], seeds=[0]).cells()[0]
    cell = base.model_copy(
        update={
            "data": base.data.model_copy(update={"noise_std": 0.1, "n_observed": 25}),
            "training": base.training.model_copy(update={"epochs": 200}),
            "model": {**base.model, "solver": "dopri5"},
        }
    )
    variant = variant_of(cell, base)
    assert variant == (
        'data.n_observed=25; data.noise_std=0.1; training.epochs=200; model.solver="dopri5"'
    )
    assert variant_overrides("node", variant) == {
        "data": {"n_observed": 25, "noise_std": 0.1},
        "training": {"epochs": 200},
        "models": {"node": {"solver": "dopri5"}},
    }
    assert variant_of(base, base) == "" and variant_of(cell, None) == ""
    with pytest.raises(ValueError, match="not a ledger variant"):
        variant_overrides("node", "epochs=200")


def test_the_paper_settings_of_a_study_are_what_it_plans(paper_cells):
    """The planned cells are the body's own at the paper's budget: e.g. the latent sizes of
    Table 5's bottom block on Neural Laplace only, and the study's seeds."""
    latent = planned_cells("latent-dim")
    assert {c.method for c in latent} == {"neural_laplace"}
    assert {c.model.get("latent_dim") for c in latent} == {1, 2, 4, 8, 16, 32}
    noise = [c for s, _, c in paper_cells if s == "noise"]
    assert noise and all(c.data.noise_std > 0 for c in noise)
    assert all(c.training.epochs == 1000 for c in noise)


def _cell(study="", ablation="", measure="", seed=0, method="node", h="a") -> LedgerCell:
    return LedgerCell("integro_de", method, seed, h * 64, "today", ablation, study, measure)


def test_a_study_cell_counts_any_record_of_its_config_and_what_it_measures():
    table3 = _record("integro_de", "node", 0, config_hash="a" * 64, numerics="today")
    noise = _cell("noise", "data.noise_std=0.1", h="b")
    twin = _cell("waveforms", h="a")  # the same config as Table 3's cell
    cmi = _cell("cmi", measure="cmi_bits", h="a")
    states = {s.cell: s for s in cell_states([table3], [_cell(h="a"), noise, twin, cmi])}
    assert states[_cell(h="a")].state == "recorded"
    assert states[twin].state == "recorded" and states[twin].record == table3
    assert states[noise].state == "missing"
    assert states[cmi].state == "missing"  # Table 3's record has no CMI
    measured = _record(
        "integro_de", "node", 0, config_hash="a" * 64, study="cmi", measures={"cmi_bits": 2.5}
    )
    (state,) = cell_states([table3, measured], [cmi])
    assert state.state == "recorded" and state.record.measures == {"cmi_bits": 2.5}
    # a record that predates fingerprints counts for nothing, as Table 3's
    (old,) = cell_states([_record(config_hash="b" * 64, numerics=None)], [noise])
    assert old.state == "predates"


def test_a_study_cell_that_another_cell_trains_is_not_trained_twice():
    table3, twin = _cell(h="a"), _cell("waveforms", h="a")
    cmi = _cell("cmi", measure="cmi_bits", h="a")  # must load the model: trained (or reused)
    noise, noise_again = _cell("noise", "x", h="b"), _cell("sample-size", "y", h="b")
    states = cell_states([], [table3, twin, cmi, noise, noise_again])
    assert to_train(states) == [table3, cmi, noise]


def test_every_table_gets_its_first_seed_before_table_3s_other_seeds():
    cells = [
        LedgerCell("integro_de", "node", seed, f"{seed}" * 64, None)
        for seed in (0, 1)  # Table 3: seed 0 then 1
    ]
    cells += [
        LedgerCell("integro_de", "node", seed, f"n{seed}{study}".ljust(64, "x"), None, "v", study)
        for study in ("nfe", "noise", "ilt", "sample-size")
        for seed in (0, 1)
    ]
    cells.append(LedgerCell("integro_de", "lno", 0, "p" * 64, None))  # a peer: last
    groups = ledger_groups(cells, cell_states([], cells))
    order = [(g.study, g.method, g.seeds) for g in groups]
    assert order == [
        ("", "node", (0,)),
        ("sample-size", "node", (0,)),  # LEDGER_STUDIES' order: the cheaper table first
        ("noise", "node", (0,)),
        ("ilt", "node", (0,)),  # the paper's figures after the seven tables' first seeds
        ("nfe", "node", (0,)),
        ("", "node", (1,)),
        ("sample-size", "node", (1,)),
        ("noise", "node", (1,)),
        ("ilt", "node", (1,)),
        ("nfe", "node", (1,)),
        ("", "lno", (0,)),
    ]
    assert LEDGER_STUDIES.index("sample-size") < LEDGER_STUDIES.index("noise")


def test_a_table_with_its_first_seed_whole_waits_for_the_other_tables_first_seeds():
    """Once a row of a table has a seed on every system, its next seed is no first seed: it
    comes after every other table's first seed, not before them as the lowest missing seed."""
    cells = [
        LedgerCell("integro_de", "node", seed, f"{study[0]}{seed}".ljust(64, "x"), None, "v", study)
        for study in ("noise", "sample-size")
        for seed in (0, 1, 2)
    ]
    whole = _record("integro_de", "node", 0, config_hash="s0".ljust(64, "x"), study="sample-size")
    states = cell_states([whole], cells)
    order = [(g.study, g.seeds) for g in ledger_groups(to_train(states), states)]
    assert order == [
        ("noise", (0,)),
        ("sample-size", (1,)),  # seed by seed: the cheaper table first within a seed
        ("noise", (1,)),
        ("sample-size", (2,)),
        ("noise", (2,)),
    ]


def test_a_study_record_reads_back_and_table_3_lines_stay_as_they_were(tmp_path):
    plain = _record()
    assert set(json.loads(plain.to_json())) == set(asdict(plain)) - {
        "ablation",
        "study",
        "measures",
        "curves",
        "train_cpu_seconds",
    }
    mine = _record(study="cmi", measures={"cmi_bits": 3.25}, ablation="")
    path = tmp_path / "ledger.jsonl"
    path.write_text(plain.to_json() + "\n" + mine.to_json() + "\n")
    assert read_ledger(path) == [plain, mine]  # two records: another table asked for it
    for bad in ({"cmi_bits": float("nan")}, {"cmi_bits": True}, ["cmi_bits"]):
        data = {**asdict(mine), "measures": bad}
        with pytest.raises(ValueError, match="measures must map"):
            LedgerRecord.from_mapping(json.loads(json.dumps(data)))
    scope = LedgerScope((), (0,), frozenset({"integro_de"}), frozenset({"neural_laplace"}))
    assert scope.problem(mine) is None  # a scope computed without studies leaves them be
    knowing = LedgerScope(
        (), (0,), frozenset({"integro_de"}), frozenset({"neural_laplace"}), frozenset({"noise"})
    )
    assert "unknown study 'cmi' (known: noise)" in (knowing.problem(mine) or "")


def test_select_keeps_studies_apart_unless_asked():
    cells = (_cell(), _cell("noise", "v", h="b"), _cell("cmi", measure="m", h="a"))
    scope = LedgerScope(cells, (0,), frozenset(), frozenset(), frozenset({"noise", "cmi"}))
    assert scope.select() == [cells[0]]
    assert scope.select(studies=True) == list(cells)
    assert scope.select(studies=("cmi",)) == [cells[2]]


def test_a_studys_table_is_drawn_from_the_records_by_its_own_body():
    cells = planned_cells("solvers")
    dopri5 = [c for c in cells if c.method == "node" and c.model.get("solver") == "dopri5"]
    lv = [c for c in dopri5 if c.system == "lotka_volterra_dde"]
    values = [0.5 + 0.01 * c.seed for c in lv]
    records = [
        _record(c.system, c.method, c.seed, config_hash=c.config_hash(), test_rmse=v)
        for c, v in zip(lv, values, strict=True)
    ]
    drawn = recorded_output("solvers", records)
    (frame,) = drawn.output.tables.values()
    row = frame[
        (frame.system == "lotka_volterra_dde")
        & (frame.method == "node")
        & (frame.solver == "dopri5")
    ].iloc[0]
    assert row["value"] == pytest.approx(sum(values) / len(values))
    assert row["n"] == len(values) and row["paper"] == pytest.approx(0.5880)
    other = frame[frame.method == "anode"]
    assert (other["n"] == 0).all() and other["value"].map(math.isnan).all()
    assert drawn.recorded == len(lv) and drawn.cells == len(cells)
    assert set(drawn.figures) == {"solvers"} and drawn.figures["solvers"][:4] == b"\x89PNG"


def test_an_unknown_study_is_named_with_the_valid_ones(capsys):
    assert main(["ledger", "status", "--study", "nosie"]) == 2
    err = capsys.readouterr().err
    assert "--study nosie: not a study of the ledger" in err and "noise" in err


@pytest.mark.heavy  # a ledger run of a study cell
def test_a_measured_cell_is_recorded_with_its_models_measure(
    tmp_path, mlflow_store, prefect_server
):
    """A CMI cell reuses its Table 3 twin's run (the same config hash) and its record carries
    the CMI of that run's model: recomputed from the stored model, the same value."""
    from flows.ledger import run_ledger
    from flows.ledger.run import record_finished
    from flows.studies import measure_cell
    from flows.studies.cmi import cmi_of_run
    from tasks.ledger import hardware_name
    from tasks.tracking import connect

    config = tmp_path / "tiny.toml"
    config.write_text(
        'isolation = "thread"\nmax_workers = 1\ntorch_threads = 1\nprogress = false\n'
        "[data]\nn_trajectories = 40\n[training]\nepochs = 2\nbatch_size = 8\n"
    )
    ledger = tmp_path / "ledger.jsonl"
    selection = {
        "config_file": config,
        "systems": ["lotka_volterra_dde"],
        "methods": ["node"],
        "seeds": [0],
    }
    assert len(run_ledger(ledger, selection=selection, execution={}, say=print).appended) == 1
    (table3,) = read_ledger(ledger)
    (cell,) = paper_config(
        config_file=config, **{k: selection[k] for k in ("systems", "methods")}, seeds=[0]
    ).cells()
    cmi = LedgerCell(
        cell.system, "node", 0, table3.config_hash, table3.numerics, "", "cmi", "cmi_bits"
    )
    queries = connect(paper_config(config_file=config).tracking).queries
    assert record_finished(queries, [cmi], ledger, hardware_name) == []  # no measure: none

    def measure(c: LedgerCell, run_id: str) -> Measured:
        return measure_cell(c.study, cell, run_id, queries)

    (record,) = record_finished(queries, [cmi], ledger, hardware_name, measure)
    assert record.study == "cmi" and record.run_id == table3.run_id
    assert record.test_rmse == table3.test_rmse
    value = record.measures["cmi_bits"]
    assert math.isfinite(value) and value == cmi_of_run(cell, table3.run_id, queries)
    assert [r.study for r in read_ledger(ledger)] == ["", "cmi"]
    (state,) = cell_states(read_ledger(ledger), [cmi])
    assert state.state == "recorded" and state.record == record


def test_a_measured_twin_is_recorded_with_the_cell_it_shares_a_run_with(
    tmp_path, mlflow_store, prefect_server
):
    """``ledger run`` measures a Table 3 cell's CMI as it records the cell (its twin in the
    CMI table), instead of retraining it later."""
    from flows.ledger import run_ledger
    from flows.ledger.run import LedgerRun, Recorder
    from flows.studies.cmi import cmi_of_run
    from tasks.tracking import connect

    config = tmp_path / "tiny.toml"
    config.write_text(
        'isolation = "thread"\nmax_workers = 1\ntorch_threads = 1\nprogress = false\n'
        "[data]\nn_trajectories = 40\n[training]\nepochs = 2\nbatch_size = 8\n"
    )
    selection = {"config_file": config, "systems": ["integro_de"], "methods": ["node"]}
    ledger = tmp_path / "ledger.jsonl"
    run_ledger(ledger, selection={**selection, "seeds": [0]}, execution={}, say=print)
    (table3,) = read_ledger(ledger)
    (cell,) = paper_config(
        config_file=config, seeds=[0], systems=["integro_de"], methods=["node"]
    ).cells()
    plain = LedgerCell(cell.system, "node", 0, table3.config_hash, table3.numerics)
    twin = LedgerCell(cell.system, "node", 0, table3.config_hash, None, "", "cmi", "cmi_bits")
    queries = connect(paper_config(config_file=config).tracking).queries
    recorder = Recorder(queries, ledger, LedgerRun(), print, selection, todo=[plain, twin])
    recorder.record([plain])
    (measured,) = recorder.out.appended  # (the plain cell's record was there already)
    assert measured.study == "cmi" and twin.key in recorder.done
    assert measured.measures["cmi_bits"] == cmi_of_run(cell, table3.run_id, queries)


def _paper_nodes_record(system: str, seconds: float) -> list:
    """The paper profile's NODE cell of ``system`` at seed 0, recorded on this processor in
    ``seconds``."""
    from tasks.ledger import hardware_name

    base = paper_config(systems=[system], methods=["node"], seeds=[0]).cells()[0]
    return [
        _record(
            system,
            "node",
            0,
            config_hash=base.config_hash(),
            train_seconds=seconds,
            hardware=hardware_name("cpu"),
        )
    ]


def test_a_variant_without_records_is_expected_from_its_methods_cells_by_their_training():
    """Sample size N = 125 at 200 epochs trains about 100 × 200 of the 800 × 1000
    trajectory-epochs of the profile's cell: expected at that share of its records' time (the
    fixed cost of a benchmark aside)."""
    from flows.ledger import FIXED_SECONDS
    from flows.ledger.plan import recorded_seconds

    records = _paper_nodes_record("lotka_volterra_dde", 8000.0)
    variant = "data.n_trajectories=125; training.epochs=200"
    group = LedgerGroup("node", variant, (0,), ("lotka_volterra_dde",), "sample-size")
    config = group_config(group, {"profile": "paper"}, {"device": "cpu"})
    expected = recorded_seconds(group, config, records)
    n_train = config.split_sizes("lotka_volterra_dde")[0]
    assert n_train in (99, 100)  # (80 % of 125, as the split rounds it)
    assert expected == pytest.approx(FIXED_SECONDS + 8000.0 * (n_train * 200) / (800 * 1000))
    table3 = LedgerGroup("node", "", (0,), ("lotka_volterra_dde",))
    plain = group_config(table3, {"profile": "paper"}, {"device": "cpu"})
    assert recorded_seconds(table3, plain, records) == pytest.approx(FIXED_SECONDS + 8000.0)


def test_an_adaptive_solvers_variant_is_expected_at_its_measured_epoch_against_eulers(monkeypatch):
    """The solvers study's NODE with dopri5 (Table 10), without records of its own: expected
    from the method's Euler cells times the wall-clock measurement's dopri5 / Euler ratio of
    the same model (:func:`flows.ledger.solver_factors`), not at an Euler cell's time."""
    import flows.ledger.plan as plan
    from flows.ledger import FIXED_SECONDS

    records = _paper_nodes_record("piecewise_forcing_ode", 1000.0)
    monkeypatch.setattr(plan, "solver_factors", lambda: {("node", "dopri5"): 13.5})
    variant = 'model.atol=1e-09; model.rtol=1e-07; model.solver="dopri5"'
    group = LedgerGroup("node", variant, (0,), ("piecewise_forcing_ode",), "solvers")
    config = group_config(group, {"profile": "paper"}, {"device": "cpu"})
    assert config.cells()[0].model["solver"] == "dopri5"
    expected = plan.recorded_seconds(group, config, records)
    assert expected == pytest.approx(FIXED_SECONDS + 1000.0 * 13.5)


@pytest.mark.parametrize("study", LEDGER_STUDIES)
def test_every_published_figure_of_a_table_has_its_row(study):
    """Drawn with no record at all, a study's table at the paper's budget still shows every
    figure the paper publishes for it, each on its own row: none keyed past the table."""
    from flows.studies import get_study

    spec = get_study(study).spec
    (frame, *_) = recorded_output(study, []).output.tables.values()
    shown = frame["paper"].map(math.isfinite)
    assert shown.sum() == len(spec.paper)
    # (the paper shows these as figures only)
    assert spec.paper or study in ("observation-size", "nfe", "frequency-filter")


# -- the paper's figures: measured models, curves and timed tables ------------------------------
def test_the_figure_studies_follow_the_seven_tables_with_the_mark_their_records_need(paper_cells):
    """ILTcompar, frequencyfilter and nfes_analysis train ledger cells whose records must carry
    what the figure draws of the model (the study module's ``MEASURE``); Table 11 trains none."""
    import importlib
    from collections import Counter

    from flows.studies import MEASUREMENTS, MEASURES, get_study

    assert LEDGER_STUDIES[7:] == ("ilt", "frequency-filter", "nfe", "wallclock")
    assert Counter(s for s, _, _ in paper_cells if s in LEDGER_STUDIES[7:]) == {
        "ilt": 6,  # Lotka–Volterra × fourier, cme × 3 seeds (the fourier ones are Table 3's)
        "frequency-filter": 10,
        "nfe": 15,
    }
    for study, mark, _ in paper_cells:
        assert mark == MEASURES.get(study, "")
    for study, mark in MEASURES.items():
        module = importlib.import_module(f"flows.studies.{study.replace('-', '_')}")
        assert module.MEASURE == mark and get_study(study).measure is not None
    assert MEASUREMENTS == {"ilt": ("ilt_accuracy",), "wallclock": ("wallclock",)}


def test_a_record_with_curves_round_trips_and_an_old_line_reads_as_it_was(tmp_path):
    from tasks.ledger import DEFAULT_LEDGER

    history = [(float(epoch), 1.0 / (epoch + 1)) for epoch in range(1000)]
    curve = downsample(history)
    assert len(curve) == MAX_CURVE_POINTS and curve[0] == (0.0, 1.0) and curve[-1][0] == 999.0
    short = [(float(e), 0.5**e) for e in range(5)]
    assert downsample(short) == tuple(short)  # (a short one as it is)
    mine = _record(study="ilt", measures={"rmse_clean": 0.25}, curves={"train_loss": curve})
    old_line = _record().to_json()
    assert "curves" not in old_line and "measures" not in old_line
    path = tmp_path / "ledger.jsonl"
    path.write_text(old_line + "\n" + mine.to_json() + "\n")
    old, new = read_ledger(path)
    assert old.to_json() == old_line and old.curves == {} and not old.measured.has("train_loss")
    assert new == mine and new.measured == Measured({"rmse_clean": 0.25}, {"train_loss": curve})
    assert new.measured.has("train_loss") and new.measured.has("rmse_clean")
    # every committed line reads and is written back byte for byte (none rewritten)
    lines = [line for line in DEFAULT_LEDGER.read_text().splitlines() if line.strip()]
    for line in lines:
        assert LedgerRecord.from_mapping(json.loads(line)).to_json() == line
    for bad, problem in (
        ({"train_loss": [[0, 1.0]] * 2}, "its x must increase"),
        ({"train_loss": [[e, 1.0] for e in range(MAX_CURVE_POINTS + 1)]}, "101 points"),
        ({"train_loss": []}, "0 points"),
        ({"train_loss": [[0, float("nan")]]}, "finite numbers"),
        ({"train_loss": [[0, 1.0, 2.0]]}, "finite numbers"),
        ({"train_loss": [[0, True]]}, "finite numbers"),
        ([[0, 1.0]], "curves must map"),
    ):
        data = json.loads(json.dumps({**asdict(mine), "curves": bad}))
        with pytest.raises(ValueError, match=problem):
            LedgerRecord.from_mapping(data)


class _Found:
    """A FINISHED run as :meth:`tasks.tracking.Queries.finished_cells` finds it."""

    def __init__(self, run_id: str) -> None:
        self.run_id, self.test_rmse = run_id, 0.5
        self.metrics = {"test_rmse": 0.5, "epochs_run": 1000.0}
        self.tags = {"device_used": "cpu", "numerics.model": "m", "numerics.system": "s"}


class _Store:
    """The queries a cell's record and its measure need, without a tracking store."""

    def __init__(self, hashes: list[str]) -> None:
        self.hashes = hashes

    def finished_cells(self, by_hash):
        return {h: _Found(f"run{i}") for i, h in enumerate(self.hashes) if h in by_hash}

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        assert key == "train_loss"
        return [(epoch, 2.0 / (epoch + 1)) for epoch in range(1000)]


def test_a_run_of_table_3_alone_finds_the_study_twins_it_must_measure(tmp_path):
    """The CMI table measures Table 3's own cells (Mackey–Glass, Lotka–Volterra, stiff Van der
    Pol): a ``ledger run`` of Table 3 alone, no study selected, still finds the CMI twins of
    the cells it trains, to measure from the runs it makes; not of a system the CMI table
    leaves out, nor a twin the ledger holds already."""
    from flows.ledger.plan import measured_twins, selected_states, selection_scope

    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("")
    selection = {
        "profile": "paper",
        "systems": ["lotka_volterra_dde", "integro_de"],
        "methods": ["node"],
        "seeds": [0],
        "ablations": False,
        "peers": False,
        "studies": False,
    }
    _, states = selected_states(ledger, selection_scope(selection, ledger=ledger), selection)
    todo = to_train(states)
    assert sorted(c.system for c in todo) == ["integro_de", "lotka_volterra_dde"]
    assert not any(c.study for c in todo)
    (twin,) = measured_twins(ledger, selection, todo)
    (lv,) = [c for c in todo if c.system == "lotka_volterra_dde"]
    assert (twin.study, twin.measure, twin.config_hash) == ("cmi", "cmi_bits", lv.config_hash)
    assert (twin.system, twin.method, twin.seed) == (lv.system, lv.method, lv.seed)
    measured = _record(
        lv.system, "node", 0, config_hash=lv.config_hash, study="cmi", measures={"cmi_bits": 2.5}
    )
    ledger.write_text(measured.to_json() + "\n")
    assert measured_twins(ledger, selection, todo) == []
    assert measured_twins(ledger, selection, []) == []


@pytest.mark.heavy  # a ledger run
def test_a_run_records_the_twins_it_is_handed_with_the_cells_it_trains(
    tmp_path, mlflow_store, prefect_server, monkeypatch
):
    """``ledger run`` hands the twins :func:`flows.ledger.plan.measured_twins` finds to its
    recorder: a run of Table 3 alone records the CMI twin, measured from the run just made;
    ``ledger record`` records it too from the store's run."""
    import flows.ledger.run as run
    from flows.studies.cmi import cmi_of_run
    from tasks.tracking import connect

    config = tmp_path / "tiny.toml"
    config.write_text(
        'isolation = "thread"\nmax_workers = 1\ntorch_threads = 1\nprogress = false\n'
        "[data]\nn_trajectories = 40\n[training]\nepochs = 2\nbatch_size = 8\n"
    )
    where = {"systems": ["lotka_volterra_dde"], "methods": ["node"], "seeds": [0]}
    (cell,) = paper_config(config_file=config, **where).cells()
    twin = LedgerCell(cell.system, "node", 0, cell.config_hash(), None, "", "cmi", "cmi_bits")
    handed: list = []

    def twins(ledger, selection, todo, say=None):
        handed.append([c.config_hash for c in todo])
        return [twin]

    monkeypatch.setattr(run, "measured_twins", twins)
    ledger = tmp_path / "ledger.jsonl"
    out = run.run_ledger(ledger, selection={"config_file": config, **where}, execution={})
    assert handed == [[cell.config_hash()]]
    table3, measured = out.appended
    assert (out.todo, out.twins) == (1, 1)  # one cell to train, and its twin measured
    assert (table3.study, measured.study) == ("", "cmi")
    assert measured.run_id == table3.run_id and measured.test_rmse == table3.test_rmse
    queries = connect(paper_config(config_file=config).tracking).queries
    assert measured.measures["cmi_bits"] == cmi_of_run(cell, table3.run_id, queries)
    assert [r.study for r in read_ledger(ledger)] == ["", "cmi"]
    # `ledger record` (the store's finished runs into another ledger file) does the same
    again = tmp_path / "again.jsonl"
    recorded = run.record_store(again, selection={"config_file": config, **where}, execution={})
    assert [(r.study, r.run_id) for r in recorded] == [("", table3.run_id), ("cmi", table3.run_id)]
    assert recorded[1].measures == measured.measures and len(handed) == 2


def test_a_measured_cell_is_recorded_with_its_curve_from_the_run_just_made(tmp_path, monkeypatch):
    """The recording path (``record_finished``, with the study's own measure through
    :func:`flows.studies.measure_cell`) writes the ILT cell's training-loss curve into its
    record; read back, the cell counts as recorded and the curve is the run's, cut to 100
    points."""
    from flows.ledger.run import record_finished
    from flows.studies import measure_cell

    (cell, *_) = [c for c in planned_cells("ilt") if c.model.get("ilt") == "cme"]
    mark = LedgerCell(
        cell.system, cell.method, cell.seed, cell.config_hash(), "today", "v", "ilt", "train_loss"
    )
    store, ledger = _Store([cell.config_hash()]), tmp_path / "ledger.jsonl"

    def measure(c: LedgerCell, run_id: str) -> Measured:
        return measure_cell(c.study, cell, run_id, store)

    (record,) = record_finished(store, [mark], ledger, lambda _: "some CPU", measure)
    curve = record.curves["train_loss"]
    assert len(curve) == MAX_CURVE_POINTS and curve[0] == (0.0, 2.0) and curve[-1] == (999, 0.002)
    assert read_ledger(ledger) == [record] and record.study == "ilt"
    (state,) = cell_states(read_ledger(ledger), [mark])
    assert state.state == "recorded" and record.numerics == "m/s"
    from flows.studies import MEASURES

    monkeypatch.setitem(MEASURES, "ilt", "cmi_bits")  # (a mark the curve is not)
    with pytest.raises(ValueError, match="measured no 'cmi_bits'"):
        measure_cell("ilt", cell, "run0", store)


def _records_of(study: str, measured, **fields) -> list[LedgerRecord]:
    """A record of each planned cell of ``study``: ``measured(cell)`` -> (measures, curves)."""
    out = []
    for cell in planned_cells(study):
        measures, curves = measured(cell)
        out.append(
            _record(
                cell.system,
                cell.method,
                cell.seed,
                config_hash=cell.config_hash(),
                study=study,
                measures=measures,
                curves=curves,
                **fields,
            )
        )
    return out


def test_the_ilt_figure_and_table_12_are_drawn_from_records_and_the_measurement(tmp_path):
    """ILTcompar's curves from the records' ``train_loss``, Table 12 from the committed
    measurement (no training, no timing): with no measurement, every algorithm's row without a
    value, the paper's figures all the same."""
    from flows.studies import measurement_rows
    from tasks.reports import record_measurement

    def loss(cell):
        fast = cell.model.get("ilt") == "fourier"
        return {}, {"train_loss": tuple((e, (1.0 if fast else 2.0) / (e + 1)) for e in range(50))}

    records = _records_of("ilt", loss, test_rmse=0.2)
    bare = recorded_output("ilt", records, measurements=tmp_path)
    assert bare.measurements == {"ilt_accuracy": None}
    accuracy = bare.output.tables["ilt_accuracy"]
    assert accuracy["value"].isna().all() and accuracy["paper"].notna().sum() >= 5
    frame = accuracy[["algorithm", "value", "std", "n", "us_per_point"]].assign(
        value=[0.017, 7e-10, 0.44, 0.28, 0.0069, 2e-11], n=1, us_per_point=1.5
    )
    record_measurement("ilt_accuracy", "t", "c", *measurement_rows(frame), folder=tmp_path)
    drawn = recorded_output("ilt", records, measurements=tmp_path)
    assert drawn.measurements["ilt_accuracy"] is not None
    accuracy = drawn.output.tables["ilt_accuracy"].set_index("algorithm")
    assert accuracy.loc["fourier", "value"] == pytest.approx(0.017)
    assert accuracy["std"].dtype == float and accuracy["std"].isna().all()  # ("nan" read back)
    assert accuracy.loc["fourier", "verdict"] != "–"  # judged against the paper's 0.0171
    training = drawn.output.tables["ilt_training"]
    assert list(training["n"]) == [3, 3] and training["value"].tolist() == pytest.approx([0.2, 0.2])
    assert drawn.recorded == drawn.cells == 6
    assert set(drawn.figures) == {"ilt_accuracy", "ilt_training_loss"}
    # without their curve, records do not count for the figure's cells
    plain = [r.__class__(**{**asdict(r), "curves": {}}) for r in records]
    assert recorded_output("ilt", plain, measurements=tmp_path).recorded == 0


def test_the_nfe_figure_is_drawn_from_the_records_curves():
    def nfe(cell):
        scale = 1.0 if cell.method == "neural_laplace" else 100.0 + cell.seed
        horizon = tuple((dt, scale * dt) for dt in (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0))
        points = tuple((float(n), float(n)) for n in (1, 10, 100, 1000))
        return {}, {"nfe_horizon": horizon, "nfe_points": points}

    drawn = recorded_output("nfe", _records_of("nfe", nfe))
    horizon = drawn.output.tables["nfe_horizon"].set_index(["method", "dt"])
    assert horizon.loc[("neural_laplace", 100.0), "value"] == 100.0
    assert horizon.loc[("node", 100.0), "value"] == pytest.approx(100 * 102.0)  # seeds 0-4
    assert horizon.loc[("node", 100.0), "n"] == 5
    assert (drawn.output.tables["nfe_points"]["n"] == 5).all()
    assert set(drawn.figures) == {"nfe_horizon", "nfe_points"} and drawn.recorded == 15
    empty = recorded_output("nfe", []).output.tables["nfe_horizon"]
    assert len(empty) == 21 and (empty["n"] == 0).all()  # every row, nothing recorded


def test_the_frequency_filter_table_and_figure_are_drawn_from_the_records():
    t = tuple((0.1 * i, float(np.sin(0.1 * i))) for i in range(60))

    def filtered(cell):
        low = cell.model.get("max_frequency") is not None
        measures = {
            "rmse_clean": 0.3 if low else 0.5,
            "rmse_corrupted": 0.6,
            "corruption_amplitude": 0.01 if low else 0.4,
        }
        return measures, dict.fromkeys(("observed", "corrupted", "clean", "prediction"), t)

    drawn = recorded_output("frequency-filter", _records_of("frequency-filter", filtered))
    table = drawn.output.tables["frequency_filter"].set_index("variant")
    assert table.loc["low-pass s≤3", "value"] == pytest.approx(0.3)
    assert table.loc["unfiltered", "corruption_amplitude"] == pytest.approx(0.4)
    assert (table["rmse_to_corrupted"] == 0.6).all() and (table["n"] == 5).all()
    assert drawn.figures["frequency_filter"][:4] == b"\x89PNG"


def test_the_wallclock_table_is_drawn_from_its_measurement_naming_the_device(tmp_path):
    from flows.ledger.study_text import study_lines
    from flows.studies import measurement_rows
    from tasks.ledger import ledger_status
    from tasks.reports import record_measurement

    bare = recorded_output("wallclock", [], measurements=tmp_path)
    assert bare.cells == 0 and bare.output.tables["wallclock"]["value"].isna().all()
    rows = [
        {"method": "node", "solver": "euler", "value": 2.0, "std": 0.0, "n": 1,
         "nfe_per_batch": 1.0, "device": "CPU, 2 torch threads"},
        {"method": "neural_laplace", "solver": "–", "value": 0.5, "std": 0.0, "n": 1,
         "nfe_per_batch": 1.0, "device": "CPU, 2 torch threads"},
    ]  # fmt: skip
    import pandas as pd

    frame = pd.DataFrame(rows)
    record_measurement(
        "wallclock",
        "t",
        "c",
        *measurement_rows(frame),
        folder=tmp_path,
        machine="Some CPU, 2 cores",
    )
    table = recorded_output("wallclock", [], measurements=tmp_path).output.tables["wallclock"]
    node = table.set_index(["method", "solver"]).loc[("node", "euler")]
    assert node["value"] == 2.0 and node["x_neural_laplace"] == 4.0 and node["paper"] == 1.92
    assert node["device"] == "CPU, 2 torch threads" and len(table) == 8
    status = ledger_status([], [], tables=("wallclock",))
    (line,) = study_lines(status, tmp_path)
    assert line.startswith("wallclock (Table 11): no cell to train, its table is timed")
    assert "results/measurements/wallclock.json (measured on Some CPU" in line
    (missing,) = study_lines(status, tmp_path / "none")
    assert "not measured yet" in missing and "--studies wallclock" in missing


def test_the_figure_studies_measure_a_trained_model_as_their_records_keep_it(
    tmp_path, mlflow_store, prefect_server
):
    """Each figure study's measure of a real (tiny) trained run, as ``ledger run`` records it
    (:func:`flows.studies.measure_cell`): its mark, finite numbers, curves a record accepts."""
    from flows.ledger import run_ledger
    from flows.studies import MEASURES, measure_cell
    from tasks.tracking import connect

    config = tmp_path / "tiny.toml"
    config.write_text(
        'isolation = "thread"\nmax_workers = 1\ntorch_threads = 1\nprogress = false\n'
        "[data]\nn_trajectories = 40\n[training]\nepochs = 3\nbatch_size = 8\n"
    )
    ledger = tmp_path / "ledger.jsonl"
    selection = {
        "config_file": config,
        "systems": ["noisy_sines", "piecewise_forcing_ode"],
        "methods": ["neural_laplace"],
        "seeds": [0],
        "ablations": False,
    }
    assert len(run_ledger(ledger, selection=selection, execution={}, say=print).appended) == 2
    records = {r.system: r for r in read_ledger(ledger)}
    cells = {
        c.system: c
        for c in paper_config(
            config_file=config, **{k: selection[k] for k in ("systems", "methods", "seeds")}
        ).cells()
    }
    queries = connect(paper_config(config_file=config).tracking).queries
    measured = {
        study: measure_cell(study, cells[system], records[system].run_id, queries)
        for study, system in (
            ("ilt", "piecewise_forcing_ode"),
            ("nfe", "piecewise_forcing_ode"),
            ("frequency-filter", "noisy_sines"),
        )
    }
    for study, m in measured.items():
        assert m.has(MEASURES[study])
        line = _record(study=study, measures=dict(m.measures), curves=dict(m.curves))
        assert LedgerRecord.from_mapping(json.loads(line.to_json())) == line  # (as kept)
    epochs = [e for e, _ in measured["ilt"].curves["train_loss"]]
    assert epochs == [0.0, 1.0, 2.0]  # the run's three epochs
    horizon = dict(measured["nfe"].curves["nfe_horizon"])
    assert set(horizon) == {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0}
    assert set(horizon.values()) == {1.0}  # Neural Laplace: one evaluation of g, whatever Δt
    ff = measured["frequency-filter"]
    assert all(math.isfinite(v) for v in ff.measures.values()) and len(ff.measures) == 3
    assert set(ff.curves) == {"observed", "corrupted", "clean", "prediction"}


def test_a_study_line_counts_as_table_3_s_only_the_cells_on_its_systems():
    """A study cell at the profile's own config is Table 3's cell when its system is one of
    Table 3's: the toy waveforms' cells are at the profile's config on systems of their own."""
    from flows.ledger.study_text import study_lines
    from tasks.ledger import ledger_status

    def cell(system, study, ablation=""):
        return LedgerCell(system, "node", 0, f"{system}-{study}-{ablation}", None, ablation, study)

    cells = [
        cell("spiral_dde", "solvers"),
        cell("integro_de", "solvers"),
        cell("integro_de", "solvers", "model.solver=dopri5"),
        cell("sine", "waveforms"),
        cell("square", "waveforms"),
    ]
    status = ledger_status([], cells, tables=("solvers", "waveforms"))
    solvers, waveforms = study_lines(status, None)
    assert "3 missing; 2 are Table 3's own cells" in solvers
    assert "own cells" not in waveforms and "2 missing" in waveforms
