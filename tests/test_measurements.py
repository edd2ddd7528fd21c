"""Measurement records: written, read back unchanged, and rendered as a table that holds every
cell of every row (what the docs' generator puts on the pages)."""

from __future__ import annotations

import subprocess

import pytest

from tasks.reports.measurements import (
    current_commit,
    measurement_markdown,
    read_measurement,
    record_measurement,
    show_measurement,
)

COLUMNS = ("model", "s/epoch", "note")
ROWS = (("node", "1.5", "packed."), ("neural_laplace", "0.25", "one by one"))


def test_a_record_reads_back_as_written_and_names_another_machine(tmp_path):
    path = record_measurement(
        "probe", "a probe", "python probe.py", COLUMNS, ROWS, "Quiet.", tmp_path, "GPU X, 16 cores"
    )
    m = read_measurement(path)
    assert (m.name, m.title, m.command, m.note) == ("probe", "a probe", "python probe.py", "Quiet.")
    assert m.columns == COLUMNS and m.rows == ROWS
    assert m.machine == "GPU X, 16 cores"
    here = read_measurement(record_measurement("here", "t", "c", COLUMNS, ROWS, folder=tmp_path))
    assert "cores, load" in here.machine  # this machine, with its load, when none is named


def test_the_table_holds_every_cell_and_its_provenance(tmp_path):
    m = read_measurement(record_measurement("probe", "a probe", "cmd", COLUMNS, ROWS, "", tmp_path))
    table = measurement_markdown(m).splitlines()
    assert table[0] == "| model | s/epoch | note |"
    assert table[2:4] == ["| node | 1.5 | packed. |", "| neural_laplace | 0.25 | one by one |"]
    assert table[-1] == f"*a probe*: `cmd`, commit `{m.commit}`, {m.machine}."


def test_a_projection_scales_an_adaptive_solvers_cells_by_its_measured_epoch(tmp_path):
    """``benchmarks/study_projection.py``: a dopri5 cell costs its Euler records' time times the
    wall-clock measurement's dopri5 / Euler ratio of the same model; an Euler cell, and a
    solver the measurement does not time, cost the records' time."""
    from benchmarks.study_projection import cell_seconds
    from flows.ledger import solver_factors
    from tasks.config import CellConfig

    rows = (
        ("node", "euler", "2.0"),
        ("node", "dopri5", "30.0"),
        ("anode", "dopri5", "5.0"),  # no Euler row of its own: no ratio
        ("neural_laplace", "–", "1.0"),
    )
    path = record_measurement(
        "wallclock", "t", "c", ("method", "solver", "value"), rows, "", tmp_path
    )
    factors = solver_factors(path)
    assert factors == {("node", "dopri5"): 15.0}
    times = {("node", "integro_de"): [100.0, 300.0, 200.0]}  # median 200 s at the paper's budget

    def cell(**model) -> CellConfig:
        return CellConfig(system="integro_de", method="node", seed=0, model=model)

    assert cell_seconds(cell(), times, factors) == 200.0
    assert cell_seconds(cell(solver="dopri5", rtol=1e-7, atol=1e-9), times, factors) == 3000.0
    assert cell_seconds(cell(solver="bosh3"), times, factors) == 200.0
    assert solver_factors(tmp_path / "none.json") == {}


def test_a_projection_counts_a_cell_an_earlier_table_trains_once():
    """``benchmarks/study_projection.py``: the NFE figure's dopri5 NODE and ANODE cells are the
    solvers table's (one config each, measured from that table's runs), so the NFE figure
    trains none of them; its Neural Laplace cells are Table 3's, free unless their records lack
    the NFEs; the solvers table's Euler cells are Table 3's."""
    from benchmarks.study_projection import planned_cells, split_cells
    from tasks.ledger.scope import ledger_cell_configs

    table3 = {c.config_hash() for c, _ in ledger_cell_configs()}
    solvers, _ = planned_cells("solvers")
    nfe, _ = planned_cells("nfe")
    shared, trained = split_cells(solvers, table3, set(), set())
    assert {c.model.get("solver", "euler") for c in trained} == {"dopri5"}
    assert len(shared) == len(solvers) - len(trained) == 30  # Euler NODE/ANODE and NL
    earlier = {c.config_hash() for c in trained}
    dopri5 = [c for c in nfe if c.method != "neural_laplace"]
    assert len(dopri5) == 10 and {c.config_hash() for c in dopri5} <= earlier
    assert split_cells(nfe, table3, set(), earlier) == (nfe, [])
    nl = {c.config_hash() for c in nfe if c.method == "neural_laplace"}
    assert split_cells(nfe, table3, nl, earlier)[1] == [c for c in nfe if c.config_hash() in nl]
    assert split_cells(nfe, table3, set(), set())[1] == dopri5  # (alone, it trains them)


def test_a_records_commit_says_when_code_differs_from_it_not_when_records_do(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    try:
        git("init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git here")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "ledger.jsonl").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    clean = current_commit(tmp_path)
    assert len(clean) == 10 and "uncommitted" not in clean
    (tmp_path / "results" / "ledger.jsonl").write_text("{}\n{}\n")  # a record written
    assert current_commit(tmp_path) == clean
    (tmp_path / "code.py").write_text("x = 2\n")  # the code measured changed
    assert current_commit(tmp_path) == f"{clean} (with uncommitted changes)"


def test_a_benchmark_shows_its_table_and_records_it_only_when_asked(tmp_path, capsys):
    assert show_measurement(COLUMNS, ROWS, "Quiet.", folder=tmp_path) is None
    shown = capsys.readouterr().out
    assert shown.splitlines()[:4] == [
        "| model | s/epoch | note |",
        "|---|---|---|",
        "| node | 1.5 | packed. |",
        "| neural_laplace | 0.25 | one by one |",
    ]
    assert shown.rstrip().endswith("Quiet.") and not list(tmp_path.iterdir())
    path = show_measurement(
        COLUMNS, ROWS, record=("probe", "a probe", "p --record"), folder=tmp_path
    )
    assert path == tmp_path / "probe.json" and f"recorded {path}" in capsys.readouterr().out
    m = read_measurement(path)
    assert (m.name, m.title, m.command, m.rows) == ("probe", "a probe", "p --record", ROWS)
