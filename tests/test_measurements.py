"""Measurement records: written, read back unchanged, and rendered as a table that holds every
cell of every row (what the docs' generator puts on the pages)."""

from __future__ import annotations

from tasks.reports.measurements import measurement_markdown, read_measurement, record_measurement

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
