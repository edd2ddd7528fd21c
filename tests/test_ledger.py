"""The results ledger: its reader, status, table, and ``ledger run`` recording finished cells."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from flows.cli import main
from flows.ledger import paper_config, run_ledger
from tasks.ledger import (
    DEFAULT_LEDGER,
    LedgerError,
    LedgerRecord,
    append_records,
    cell_states,
    read_ledger,
)
from tasks.ledger_views import ledger_markdown

ROOT = Path(__file__).resolve().parent.parent

#: A config layered on the paper profile that trains in seconds (tests only).
TINY = """\
isolation = "thread"
max_workers = 1
torch_threads = 1
progress = false
[data]
n_trajectories = 30
[training]
epochs = {epochs}
batch_size = 8
"""


def _record(system="integro_de", method="neural_laplace", seed=0, **kw) -> LedgerRecord:
    base = dict(
        system=system,
        method=method,
        seed=seed,
        config_hash="h" * 64,
        commit="abc",
        numerics=None,
        test_rmse=0.01,
        best_val_rmse=0.01,
        rmse_without_top=0.01,
        top_share=0.1,
        epochs=1000,
        best_epoch=999,
        train_seconds=10.0,
        device="cpu",
        hardware="some CPU",
        run_id="r" * 32,
    )
    return LedgerRecord(**{**base, **kw})


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _line(**kw) -> str:
    return json.dumps({**asdict(_record()), **kw})


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("{not json", "not a valid ledger record"),
        (json.dumps({k: v for k, v in asdict(_record()).items() if k != "test_rmse"}), "test_rmse"),
        (_line(test_rmse=float("nan")), "test_rmse must be a finite number"),
        (_line(seed=-1), "seed must be a non-negative integer"),
        (_line(seed=True), "seed must be a non-negative integer"),
        (_line(top_share=1.5), "top_share out of range"),
        (_line(colour="red"), "unknown field(s) colour"),
        (_line(system=""), "system must be a non-empty string"),
        ("[1, 2]", "a record is a JSON object"),
    ],
)
def test_reader_refuses_a_malformed_line_naming_it(tmp_path, bad, problem):
    path = _write(tmp_path / "ledger.jsonl", [_line(), "", bad])
    with pytest.raises(LedgerError) as e:
        read_ledger(path)
    assert f"{path}:3: " in str(e.value) and problem in str(e.value)


def test_reader_refuses_a_duplicate_naming_both_lines(tmp_path):
    path = _write(tmp_path / "ledger.jsonl", [_line(), _line(seed=1), _line(test_rmse=0.5)])
    with pytest.raises(LedgerError, match=r"ledger.jsonl:3: duplicate of line 1 "):
        read_ledger(path)
    # Another numerics fingerprint of the same cell and config is history, not a duplicate.
    _write(path, [_line(), _line(numerics="n2")])
    assert len(read_ledger(path)) == 2


def test_append_keeps_one_record_per_key_and_whole_lines(tmp_path):
    path = tmp_path / "results" / "ledger.jsonl"
    first = append_records(path, [_record(), _record(seed=1)])
    assert len(first) == 2
    # a hand edit left the last line without its newline: the next record still gets its own
    path.write_text(path.read_text().rstrip("\n"))
    again = append_records(path, [_record(), _record(seed=2, test_rmse=0.02)])
    assert [r.seed for r in again] == [2]
    records = read_ledger(path)
    assert [r.seed for r in records] == [0, 1, 2] and records[2].test_rmse == 0.02


def test_status_counts_each_state_on_a_fixture():
    cells = paper_config(methods=["neural_laplace", "node"], seeds=[0, 1]).cells()
    assert len(cells) == 24
    by_key = {(c.system, c.method, c.seed): c.config_hash() for c in cells}

    def at(system, method, seed, **kw):
        return _record(system, method, seed, config_hash=by_key[system, method, seed], **kw)

    records = [
        at("spiral_dde", "neural_laplace", 0),
        at("spiral_dde", "neural_laplace", 1, numerics="old"),
        at("integro_de", "node", 1, numerics="today"),
        _record("integro_de", "node", 0, config_hash="0" * 64),  # another config only
        _record("piecewise_forcing_ode", "node", 3),  # a seed outside the selection
    ]
    states = cell_states(records, cells, numerics=lambda cell: "today")
    got = {(s.system, s.method, s.seed): s.state for s in states}
    assert got[("spiral_dde", "neural_laplace", 0)] == "recorded"  # no fingerprint to compare
    assert got[("spiral_dde", "neural_laplace", 1)] == "other_numerics"
    assert got[("integro_de", "node", 1)] == "recorded"
    assert got[("integro_de", "node", 0)] == "other_config"
    assert sorted(s.state for s in states).count("missing") == 20


def test_status_command_counts_the_ledger(tmp_path, capsys):
    cells = paper_config(methods=["neural_laplace"], seeds=[0]).cells()
    path = tmp_path / "ledger.jsonl"
    append_records(
        path, [_record(c.system, seed=0, config_hash=c.config_hash()) for c in cells[:2]]
    )
    code = main(["ledger", "status", "--ledger", str(path), "--methods", "neural_laplace"])
    out = capsys.readouterr().out
    assert code == 0
    assert "2 records; of the 30 selected cells of the paper profile, 2 recorded, 28 missing" in out
    assert "neural_laplace needs 28:" in out


def test_table_is_the_hand_computed_mean_and_std(tmp_path):
    cells = paper_config(methods=["neural_laplace"], systems=["integro_de", "spiral_dde"]).cells()
    h = {(c.system, c.seed): c.config_hash() for c in cells}
    values = [0.03, 0.04, 0.05]
    records = [
        _record("integro_de", seed=s, config_hash=h["integro_de", s], test_rmse=v)
        for s, v in enumerate(values)
    ]
    # spiral: one seed, dominated by its top share; and a record under another config, ignored
    records.append(
        _record(
            "spiral_dde",
            config_hash=h["spiral_dde", 0],
            test_rmse=0.9,
            top_share=0.8,
            rmse_without_top=0.0321,
        )
    )
    records.append(_record("spiral_dde", seed=1, config_hash="0" * 64, test_rmse=5.0))
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)  # population std, as results_table
    text = ledger_markdown(records, cells)
    assert f"{mean:.4g} ± {std:.4g} (n=3)" == "0.04 ± 0.008165 (n=3)"
    assert "0.04 ± 0.008165 (n=3)" in text
    assert "0.9 (n=1)" in text and "(n=2)" not in text
    assert "dominated by a few samples (80% of the error); 0.0321 without them" in text
    assert "4 of the 10 selected cells recorded. Made by: 4 on cpu (some CPU)." in text


def test_table_readme_block_is_rewritten_and_refused_without_markers(tmp_path, capsys):
    from flows.cli.ledger import README_BEGIN, README_END

    readme = tmp_path / "README.md"
    readme.write_text(f"# t\nbefore\n{README_BEGIN}\nstale\n{README_END}\nafter\n")
    ledger = tmp_path / "ledger.jsonl"
    args = ["ledger", "table", "--ledger", str(ledger), "--methods", "neural_laplace"]
    assert main([*args, "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "stale" not in text and "0 of the 30 selected cells recorded" in text
    assert text.startswith("# t\nbefore\n") and text.endswith(f"{README_END}\nafter\n")
    readme.write_text("no block\n")
    assert main([*args, "--readme", str(readme)]) == 2
    assert "has no generated block" in capsys.readouterr().err


def test_readme_ledger_block_is_generated_from_the_committed_ledger():
    from flows.cli.ledger import README_BEGIN, README_END

    readme = (ROOT / "README.md").read_text()
    block = readme.split(README_BEGIN, 1)[1].split(README_END, 1)[0].strip()
    cells = paper_config().cells()
    assert block == ledger_markdown(read_ledger(DEFAULT_LEDGER), cells).strip()


def test_run_records_each_finished_cell_and_not_a_failed_one(
    tmp_path, mlflow_store, prefect_server, monkeypatch
):
    import tasks.cell

    real = tasks.cell.build_cell_model

    def broken_for_spiral(cell, state_dim):
        if cell.system == "spiral_dde":
            raise RuntimeError("this cell fails on purpose")
        return real(cell, state_dim)

    monkeypatch.setattr(tasks.cell, "build_cell_model", broken_for_spiral)
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(epochs=2))
    ledger = tmp_path / "ledger.jsonl"
    selection = {
        "config_file": config,
        "systems": ["integro_de", "spiral_dde"],
        "methods": ["node"],
        "seeds": [0, 1],
    }
    said: list[str] = []
    out = run_ledger(ledger, selection=selection, execution={}, niceness=0, say=said.append)
    records = read_ledger(ledger)
    assert out.todo == 4 and len(out.appended) == 2
    assert sorted((r.system, r.seed) for r in records) == [("integro_de", 0), ("integro_de", 1)]
    assert sorted(out.failed) == ["spiral_dde/node/seed0", "spiral_dde/node/seed1"]
    cells = {c.seed: c for c in paper_config(**selection).cells() if c.system == "integro_de"}
    for r in records:
        assert r.config_hash == cells[r.seed].config_hash() and r.epochs == 2
        assert r.run_id and r.device == "cpu" and r.hardware and r.commit is not None
    # again: the finished cells are recorded, so only the failed ones are tried
    monkeypatch.setattr(tasks.cell, "build_cell_model", real)
    again = run_ledger(ledger, selection=selection, execution={}, niceness=0, say=said.append)
    assert again.todo == 2 and len(read_ledger(ledger)) == 4
    assert sum(line.startswith("ledger: recorded ") for line in said) == 4


def _nllab(*args: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **kw,
    )


def test_kill9_mid_run_keeps_the_finished_records(tmp_path):
    """``ledger run`` killed while its second cell trains: the first cell's record is in the
    ledger, nothing of the second, and ``status`` says which one is missing."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(epochs=30))
    ledger = tmp_path / "ledger.jsonl"
    env = {**os.environ, "NLLAB_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT", "PREFECT_API_URL"):
        env.pop(var, None)
    sel = ["--ledger", str(ledger), "--config", str(config), "--methods", "node"]
    sel += ["--systems", "integro_de", "--seeds", "0", "1"]
    proc = _nllab("ledger", "run", *sel, "--poll", "0.5", "--nice", "0", env=env)
    deadline = time.monotonic() + 240
    try:
        while not (ledger.exists() and ledger.read_text().strip()):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "no record within 240 s"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    records = read_ledger(ledger)
    assert [(r.seed, r.epochs) for r in records] == [(0, 30)]
    status = _nllab("ledger", "status", *sel, env=env)
    out, _ = status.communicate(timeout=120)
    assert status.returncode == 0, out
    assert "1 recorded, 1 missing" in out and "node needs 1: integro_de 1" in out


def test_record_refuses_flags_of_another_action(capsys):
    assert main(["ledger", "status", "--max-hours", "1"]) == 2
    assert "--max-hours applies to 'nllab ledger run' only" in capsys.readouterr().err
    assert main(["ledger", "run", "--format", "markdown"]) == 2


def test_record_equality_survives_a_round_trip():
    r = _record(note="n")
    assert LedgerRecord.from_mapping(json.loads(r.to_json())) == r == replace(r)
