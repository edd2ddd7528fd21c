"""The paper's other tables in the results ledger: each study's cells as its own body plans them,
tagged with how they differ from the profile's cell, trained by the ledger's groups (whose
configs must make exactly those cells), counted by config hash (a study cell that is a Table 3
cell shares its record), and drawn back into the study's table from the records."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest
from cells import ledger_record as _record

from flows.cli import main
from flows.ledger.groups import LedgerGroup
from flows.ledger.plan import group_config, ledger_groups, to_train
from flows.studies import LEDGER_STUDIES, ledger_study_cells, planned_cells, recorded_output
from tasks.config import CellConfig
from tasks.ledger import LedgerCell, LedgerRecord, LedgerScope, cell_states, read_ledger
from tasks.ledger.scope import paper_config, variant_of, variant_overrides


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
    assert {s for s, _, _ in planned} == set(LEDGER_STUDIES)
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
        LedgerCell("integro_de", "node", seed, f"n{seed}".ljust(64, "x"), None, "v", study)
        for study in ("noise", "sample-size")
        for seed in (0, 1)
    ]
    cells.append(LedgerCell("integro_de", "lno", 0, "p" * 64, None))  # a peer: last
    groups = ledger_groups(cells, cell_states([], cells))
    order = [(g.study, g.method, g.seeds) for g in groups]
    assert order == [
        ("", "node", (0,)),
        ("sample-size", "node", (0,)),  # LEDGER_STUDIES' order: the cheaper table first
        ("noise", "node", (0,)),
        ("", "node", (1,)),
        ("sample-size", "node", (1,)),
        ("noise", "node", (1,)),
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

    def measure(c: LedgerCell, run_id: str) -> dict[str, float]:
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


def test_a_variant_without_records_is_expected_from_its_methods_cells_by_their_training():
    """Sample size N = 125 at 200 epochs trains about 100 × 200 of the 800 × 1000
    trajectory-epochs of the profile's cell: expected at that share of its records' time (the
    fixed cost of a benchmark aside)."""
    from flows.ledger import FIXED_SECONDS
    from flows.ledger.plan import recorded_seconds
    from tasks.ledger import hardware_name

    base = paper_config(systems=["lotka_volterra_dde"], methods=["node"], seeds=[0]).cells()[0]
    records = [
        _record(
            "lotka_volterra_dde",
            "node",
            0,
            config_hash=base.config_hash(),
            train_seconds=8000.0,
            hardware=hardware_name("cpu"),
        )
    ]
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


@pytest.mark.parametrize("study", LEDGER_STUDIES)
def test_every_published_figure_of_a_table_has_its_row(study):
    """Drawn with no record at all, a study's table at the paper's budget still shows every
    figure the paper publishes for it, each on its own row: none keyed past the table."""
    from flows.studies import get_study

    spec = get_study(study).spec
    (frame, *_) = recorded_output(study, []).output.tables.values()
    shown = frame["paper"].map(math.isfinite)
    assert shown.sum() == len(spec.paper)
    assert spec.paper or study == "observation-size"  # (the paper shows it as a figure only)
