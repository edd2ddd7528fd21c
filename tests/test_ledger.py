"""The results ledger: its reader (validated on read), the one counting rule of status and table,
the ablation beside Table 3, and ``ledger run`` recording finished cells through the engine's
hook and stopping at its time limit through the engine's stop path."""

from __future__ import annotations

import argparse
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
import torch
from cells import ledger_record as _record

from flows.cli import main
from flows.cli.ledger import add_parser
from flows.ledger import (
    FIXED_SECONDS,
    LedgerGroup,
    expected_seconds,
    ledger_groups,
    ledger_markdown,
    run_ledger,
    status_text,
    to_train,
)
from tasks.ledger import DEFAULT_LEDGER, LedgerError, LedgerRecord, append_records, read_ledger
from tasks.ledger.scope import LedgerScope, ledger_scope, paper_config, scope_of
from tasks.ledger.views import cell_states, ledger_status

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


def _two_systems(tmp_path: Path, seeds: list[int], extra: str = "") -> tuple[Path, dict]:
    """(ledger file, selection) of node on integro_de and spiral_dde under the tiny config
    (``extra`` appended to it)."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(epochs=2) + extra)
    selection = {
        "config_file": config,
        "systems": ["integro_de", "spiral_dde"],
        "methods": ["node"],
        "seeds": seeds,
    }
    return tmp_path / "ledger.jsonl", selection


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
        (_line(train_cpu_seconds=-1.0), "train_cpu_seconds must be a non-negative number"),
        (_line(train_cpu_seconds=True), "train_cpu_seconds must be a non-negative number"),
        (_line(train_cpu_seconds="9"), "train_cpu_seconds must be a non-negative number"),
        (_line(train_seconds=float("inf")), "train_seconds must be a non-negative number"),
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


@pytest.fixture(scope="module")
def scope() -> LedgerScope:
    """Table 3 of Neural Laplace and NODE (and the ablation's cells), today's numerics faked
    as "today" (no canary runs)."""
    return scope_of(methods=["neural_laplace", "node"], numerics=lambda cell: "today")


def _at(scope: LedgerScope, system, method, seed, ablation="", **kw) -> LedgerRecord:
    (cell,) = [c for c in scope.cells if c.key == (system, method, "", ablation, seed)]
    return _record(system, method, seed, config_hash=cell.config_hash, ablation=ablation, **kw)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"system": "atlantis"}, "unknown system 'atlantis'"),
        ({"method": "no_such_model"}, "unknown method 'no_such_model'"),
        ({"seed": 2**40}, "seed 1099511627776 is not one of the profile's seeds 0-4"),
        ({"seed": 5}, "seed 5 is not one of the profile's seeds 0-4"),
        ({"ablation": "latent_dim=1"}, "unknown ablation 'latent_dim=1'"),
        ({"test_rmse": -0.1}, "test_rmse out of range"),
        ({"test_rmse": float("inf")}, "test_rmse must be a finite number"),
    ],
)
def test_reader_refuses_a_record_it_cannot_place_naming_the_line(tmp_path, scope, edit, problem):
    path = _write(tmp_path / "ledger.jsonl", [_line(), _line(**edit)])
    assert "test_rmse" in problem or len(read_ledger(path)) == 2  # structurally fine
    with pytest.raises(LedgerError) as e:
        read_ledger(path, scope)
    assert f"{path}:2: " in str(e.value) and problem in str(e.value)


def test_status_and_table_count_the_same_records(scope):
    """One rule: every record under today's config hash that names its numerics counts,
    whatever numerics made it (flagged older); one that predates fingerprints or is under
    another config hash counts for nothing; the table's n and the status grid's agree, and both
    carry the one verdict."""
    records = [
        _at(scope, "spiral_dde", "neural_laplace", 0, numerics=None),  # predates fingerprints
        _at(scope, "spiral_dde", "neural_laplace", 1, numerics="old"),
        _at(scope, "spiral_dde", "neural_laplace", 1, numerics="today", test_rmse=0.02),
        _at(scope, "stiff_van_der_pol", "node", 0, numerics="old", test_rmse=0.2),
        _at(scope, "stiff_van_der_pol", "node", 1, numerics="old", test_rmse=0.7),
        _at(scope, "stiff_van_der_pol", "node", 2, numerics="old", test_rmse=0.4),
        _record("integro_de", "node", 0, config_hash="0" * 64),  # another config only
        _at(scope, "integro_de", "neural_laplace", 0, "stereographic=False", test_rmse=0.005),
    ]
    cells = scope.select(seeds=[0, 1, 2], ablations=None)
    states = {s.cell.key: s for s in cell_states(records, cells)}
    predating = states["spiral_dde", "neural_laplace", "", "", 0]
    assert (predating.state, predating.numerics) == ("predates", "predates")
    assert predating.cell in to_train(list(states.values()))  # trained again
    one = states["spiral_dde", "neural_laplace", "", "", 1]  # today's numerics win over older
    assert one.numerics == "today" and one.record.test_rmse == 0.02
    assert states["stiff_van_der_pol", "node", "", "", 0].numerics == "older"
    assert states["integro_de", "node", "", "", 0].state == "other_config"
    status = ledger_status(records, cells)
    assert len(status.counted(ablation=False)) == 4 and len(status.counted(ablation=True)) == 1
    group = next(
        g for g in status.groups() if (g.method, g.system) == ("node", "stiff_van_der_pol")
    )
    # 0.4333 ± 0.2055 (3 seeds) against 0.2833 ± 0.0032: Welch t = 1.03, p ≈ 0.41, no
    # difference found, but 0.15 apart, beyond the paper's ± 0.0032: unclear, not a match
    assert (group.recorded, group.selected, group.older, group.verdict) == (3, 3, 3, "unclear")
    text = status_text(status, Path("ledger.jsonl"))
    assert (
        "Table 3: 4 of 36 selected cells recorded (3 by older numerics), 30 missing, 1 whose"
        in text
    )
    assert "3/3 (3 older) ?" in text
    assert "node: 3 recorded by older numerics (commit abc): seeds 0-2 of stiff_van_der_pol" in text
    assert "node: 1 recorded under another config only (config 000000000000): seed 0 of" in text
    assert (
        "neural_laplace: 1 recorded before numerics fingerprints (not counted): seed 0 of" in text
    )
    table = ledger_markdown(status)
    # the sample std (ddof 1) of 0.2, 0.7, 0.4: 0.2517
    assert "**0.4333 ± 0.2517 (n=3; 3 older)** ? (paper 0.2833 ± 0.0032)" in table  # best: bold
    assert "4 of the 36 selected cells of Table 3 recorded" in table


def test_run_trains_only_cells_without_a_record_at_todays_config(scope):
    records = [
        _at(scope, "integro_de", "node", 0, numerics="old"),
        _at(scope, "integro_de", "node", 1, numerics="today"),
        _record("integro_de", "node", 2, config_hash="0" * 64),
    ]
    states = cell_states(records, scope.select(["integro_de"], ["node"], [0, 1, 2]))
    assert [c.seed for c in to_train(states)] == [2]
    assert [c.seed for c in to_train(states, refresh_older=True)] == [0, 2]


def test_groups_give_every_column_a_first_seed_then_the_ablation_then_the_rest(scope):
    records = [_at(scope, sy, "node", s) for sy in ("integro_de", "spiral_dde") for s in (0, 1)]
    cells = scope.select(["integro_de", "spiral_dde"], ablations=None)
    states = cell_states(records, cells)
    order = [(g.method, g.ablation, g.seeds) for g in ledger_groups(to_train(states), states)]
    assert order[:2] == [
        ("neural_laplace", "", (0,)),
        ("neural_laplace", "stereographic=False", (0,)),
    ]
    assert order[2:5] == [
        ("neural_laplace", "stereographic=False", (1,)),
        ("neural_laplace", "stereographic=False", (2,)),
        ("neural_laplace", "stereographic=False", (3,)),
    ]
    assert ("node", "", (2,)) in order and order.index(("node", "", (2,))) > 5
    merged = ledger_groups(to_train(states), states, merge_seeds=True)  # a GPU: bigger packs
    assert [(g.method, g.ablation, g.seeds) for g in merged] == [
        ("neural_laplace", "", (0, 1, 2, 3, 4)),
        ("neural_laplace", "stereographic=False", (0, 1, 2, 3, 4)),
        ("node", "", (2, 3, 4)),
    ]


def test_status_command_counts_the_ledger(tmp_path, capsys):
    cells = ledger_scope().select(methods=["neural_laplace"], seeds=[0])
    path = tmp_path / "ledger.jsonl"
    append_records(path, [_record(c.system, seed=0, config_hash=c.config_hash) for c in cells[:2]])
    args = ["ledger", "status", "--ledger", str(path), "--methods", "neural_laplace"]
    code = main([*args, "--seeds", "0", "--no-ablation"])
    out = capsys.readouterr().out
    assert code == 0
    assert (
        "Table 3: 2 of 6 selected cells recorded (2 by older numerics), 4 missing, 0 whose" in out
    )
    assert "neural_laplace needs 4: seed 0 of mackey_glass_dde, stiff_van_der_pol, " in out
    assert main([*args, "--seeds", "7"]) == 2
    assert "--seeds 7: not among the profile's seeds 0, 1, 2, 3, 4" in capsys.readouterr().err


def test_table_is_the_hand_computed_mean_and_std(tmp_path, scope):
    values = [0.03, 0.04, 0.05]
    records = [
        _at(scope, "integro_de", "neural_laplace", s, test_rmse=v) for s, v in enumerate(values)
    ]
    # spiral: one seed, dominated by its top share; and a record under another config, ignored
    records.append(
        _at(
            scope,
            "spiral_dde",
            "neural_laplace",
            0,
            test_rmse=0.9,
            top_share=0.8,
            rmse_without_top=0.0321,
        )
    )
    records.append(_record("spiral_dde", seed=1, config_hash="0" * 64, test_rmse=5.0))
    # the ablation: two seeds on integro, beside the paper's 0.0048 (map off)
    records += [
        _at(scope, "integro_de", "neural_laplace", s, "stereographic=False", test_rmse=v)
        for s, v in ((0, 0.004), (1, 0.006))
    ]
    cells = scope.select(["integro_de", "spiral_dde"], ["neural_laplace"], ablations=None)
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)  # the sample std, ddof 1
    text = ledger_markdown(ledger_status(records, cells))
    assert f"{mean:.4g} ± {std:.4g} (n=3)" == "0.04 ± 0.01 (n=3)"
    assert "0.04 ± 0.01 (n=3)" in text
    assert "0.9 (n=1)" in text and "(n=2)" not in text.split("| system |")[0]
    assert "dominated by a few samples (80% of the error); 0.0321 without them" in text
    assert "4 of the 10 selected cells of Table 3 recorded. Made by: 4 on cpu (some CPU)." in text
    # Table 5's block, judged against the paper's mean ± std: map off 0.005 ± 0.001414 (2 seeds)
    # beside 0.0048 ± 0.0007 (Welch t = 0.19, within its ±: a match), map on beside
    # 0.0013 ± 0.0003 (t = 6.7, p < 0.05: worse)
    row = "| integro_de | 0.005 ± 0.001414 (n=2) ✓ (paper 0.0048 ± 0.0007) | 0.04 ± 0.01 (n=3) ▼ "
    assert row + "(paper 0.0013 ± 0.0003) |" in text
    assert "2 of the 10 selected ablation cells recorded" in text


def test_table_readme_block_is_rewritten_and_refused_without_markers(tmp_path, capsys):
    from flows.cli.ledger import README_BEGIN, README_END

    readme = tmp_path / "README.md"
    readme.write_text(f"# t\nbefore\n{README_BEGIN}\nstale\n{README_END}\nafter\n")
    ledger = tmp_path / "ledger.jsonl"
    args = ["ledger", "table", "--ledger", str(ledger), "--methods", "neural_laplace"]
    assert main([*args, "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "stale" not in text and "0 of the 30 selected cells of Table 3 recorded" in text
    assert "0 of the 30 selected ablation cells recorded" in text
    assert text.startswith("# t\nbefore\n") and text.endswith(f"{README_END}\nafter\n")
    readme.write_text("no block\n")
    assert main([*args, "--readme", str(readme)]) == 2
    assert "has no generated block" in capsys.readouterr().err


def test_the_ledger_pages_block_is_generated_from_the_committed_ledger():
    from flows.cli.ledger import README_BEGIN, README_END

    page = (ROOT / "docs" / "results" / "ledger.md").read_text()
    block = page.split(README_BEGIN, 1)[1].split(README_END, 1)[0].strip()
    scope = ledger_scope()
    status = ledger_status(read_ledger(DEFAULT_LEDGER, scope), scope.select(ablations=None))
    assert block == ledger_markdown(status).strip()


def test_callers_at_once_compute_a_new_scope_once_and_all_get_it(tmp_path, monkeypatch):
    """Four callers released together on a code state with no cached scope: one computes it
    (the others, finding its lock held, compute the cells' numerics from the scope's end into
    the cache they share, then wait for the lock and read the scope), and every caller gets the
    same scope; a later caller reads it too. Threads open the lock file each on their own, so
    ``flock`` excludes them as it does processes."""
    import threading

    import tasks.ledger.scope as scope_module

    monkeypatch.setenv("NLLAB_INSTALL_CACHE", str(tmp_path / "installation"))
    computed: list[int] = []
    real = scope_module.scope_of

    def slow_scope(*args, **kwargs):
        computed.append(threading.get_ident())
        time.sleep(0.5)  # long enough for every caller to reach the lock
        return real(*args, **{**kwargs, "numerics": lambda cell: f"fp-{cell.system}"})

    monkeypatch.setattr(scope_module, "scope_of", slow_scope)
    helped: list[tuple[int, str]] = []
    monkeypatch.setattr(
        scope_module,
        "cell_numerics",
        lambda cell: helped.append((threading.get_ident(), cell.key)) or "",
    )
    start_together = threading.Barrier(4)
    got: list[LedgerScope] = []

    def call() -> None:
        start_together.wait()
        got.append(ledger_scope(None, ["integro_de"], ["node"]))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(computed) == 1 and len(got) == 4
    assert all(g == got[0] for g in got) and got[0].cells
    assert {c.numerics for c in got[0].cells} == {f"fp-{c.system}" for c in got[0].cells}
    helpers = {t for t, _ in helped}
    assert len(helpers) == 3 and computed[0] not in helpers
    from_the_end = [c.key for c, *_ in scope_module._scope_rows(None, None, None, "paper", None)]
    assert all([k for t, k in helped if t == h] == from_the_end[::-1] for h in helpers)
    assert ledger_scope(None, ["integro_de"], ["node"]) == got[0]
    assert len(computed) == 1 and len(helped) == 3 * len(from_the_end)  # the lock was free
    # where no folder can hold the lock (nor the scope), each caller computes alone: no hang
    monkeypatch.setenv("NLLAB_INSTALL_CACHE", "/proc/nllab-cannot-be-made")
    monkeypatch.setenv("NLLAB_HOME", "/proc/nllab-cannot-be-made")
    assert ledger_scope(None, ["integro_de"], ["node"]) == got[0]
    assert len(computed) == 2


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
    ledger, selection = _two_systems(tmp_path, [0, 1])
    said: list[str] = []
    out = run_ledger(ledger, selection=selection, execution={}, say=said.append)
    records = read_ledger(ledger)
    assert out.todo == 4 and len(out.appended) == 2
    assert sorted((r.system, r.seed) for r in records) == [("integro_de", 0), ("integro_de", 1)]
    assert sorted(out.failed) == ["spiral_dde/node/seed0", "spiral_dde/node/seed1"]
    config = paper_config(
        config_file=selection["config_file"], systems=["integro_de"], methods=["node"]
    )
    cells = {c.seed: c for c in config.cells()}
    for r in records:
        assert r.config_hash == cells[r.seed].config_hash() and r.epochs == 2
        assert r.run_id and r.device == "cpu" and r.hardware and r.commit is not None
        assert r.train_seconds is not None and r.train_cpu_seconds is not None
        assert 0 < r.train_cpu_seconds and r.timed_seconds <= r.train_seconds
    # again: the finished cells are recorded, so only the failed ones are tried
    monkeypatch.setattr(tasks.cell, "build_cell_model", real)
    again = run_ledger(ledger, selection=selection, execution={}, say=said.append)
    assert again.todo == 2 and len(read_ledger(ledger)) == 4
    assert sum(line.startswith("ledger: recorded ") for line in said) == 4


@pytest.mark.heavy  # a ledger run stopped by its time limit
def test_time_limit_stops_the_running_cell_and_keeps_the_finished_one(
    tmp_path, mlflow_store, prefect_server, monkeypatch
):
    """``ledger run`` with a time limit, one fast cell and one that would train for ever: at the
    limit the slow cell stops at its next batch through the engine's stop path (its run KILLED,
    no record), the fast one stays recorded, and the run returns on time.

    The limit's clock (the run's own deadline) starts once the fast cell is recorded and the
    slow one has reported its pace: how long getting there takes depends on the machine's load,
    and a limit counted from the start would have to cover it (at load 7 on 2 cores the fast
    cell was recorded 10 s into what was a 20 s limit, the third report came 8 s later)."""
    import contextlib
    import threading

    import flows.ledger.plan
    import flows.ledger.run
    import tasks.cell
    from tasks.tracking import connect

    real = tasks.cell.build_cell_model

    def slow_on_spiral(cell, state_dim):
        model, args = real(cell, state_dim)
        if cell.system == "spiral_dde":
            forward = model.forward

            def slow(*a, **kw):
                time.sleep(0.05)
                return forward(*a, **kw)

            model.forward = slow
        return model, args

    monkeypatch.setattr(tasks.cell, "build_cell_model", slow_on_spiral)
    # the fast cell: 2 epochs; the slow one: 100 000 epochs of batches of 0.05 s at least
    slow = '[cell_overrides."spiral_dde/node".training]\nepochs = 100000\n'
    ledger, selection = _two_systems(tmp_path, [0], slow)
    # the records are said to expect a second of the group: both cells start
    monkeypatch.setattr(flows.ledger.plan, "expected_seconds", lambda *args, **kwargs: 1.0)
    limit, ready, ended = 2.0, threading.Event(), threading.Event()
    asked: list[float | None] = []
    armed: list[float] = []
    real_deadline = flows.ledger.run.deadline

    @contextlib.contextmanager
    def deadline_once_ready(seconds, stop, fired):
        asked.append(seconds)

        def arm() -> None:
            ready.wait(300)
            armed.append(time.monotonic())
            with real_deadline(limit, stop, fired):
                ended.wait()

        thread = threading.Thread(target=arm, daemon=True)
        thread.start()
        try:
            yield
        finally:
            ready.set()
            ended.set()
            thread.join()

    monkeypatch.setattr(flows.ledger.run, "deadline", deadline_once_ready)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        reports = [x for x in said if "spiral_dde/node/seed0  epoch " in x]
        if (
            any(x.startswith("ledger: recorded integro_de/node/seed0") for x in said)
            and len(reports) >= 3
            and " s/epoch lately  about " in reports[-1]
            and said[said.index(reports[-1]) - 1].startswith("ledger: Training now: 1 of the")
        ):
            ready.set()

    out = run_ledger(
        ledger,
        selection=selection,
        execution={"max_workers": 2},
        max_seconds=600,
        say=say,
        report_seconds=3,
    )
    returned = time.monotonic()
    assert asked == [600]  # the run's time limit is what its deadline counts
    assert out.stopped and not out.failed
    # on time: within seconds of the limit (a loaded machine's seconds), not after the slow
    # cell's 100 000 epochs
    assert limit <= returned - armed[0] < limit + 60
    # meanwhile it said where the running cell stood, every few seconds
    reports = [line for line in said if "spiral_dde/node/seed0  epoch " in line]
    assert len(reports) >= 3 and all(line.startswith("ledger:   ") for line in reports)
    assert "/100000  " in reports[-1] and " s/epoch lately  about " in reports[-1]
    assert said[said.index(reports[-1]) - 1].startswith("ledger: Training now: 1 of the selected")
    assert [(r.system, r.seed) for r in read_ledger(ledger)] == [("integro_de", 0)]
    import mlflow

    found = mlflow.MlflowClient().search_runs([connect().store.experiment_id])
    status = {r.data.tags.get("system"): r.info.status for r in found if r.data.tags.get("system")}
    assert status == {"integro_de": "FINISHED", "spiral_dde": "KILLED"}


def test_a_group_is_expected_to_take_what_its_method_took_on_this_processor():
    """A cell's estimate: its system's records on this processor, else its method's there,
    else its system's anywhere, else its method's; on this kind of device only."""
    records = [
        _record("integro_de", "node", 0, train_seconds=1000.0, hardware="Xeon"),
        _record("spiral_dde", "node", 0, train_seconds=1200.0, hardware="Xeon"),
        _record("integro_de", "node", 1, train_seconds=500.0, hardware="EPYC"),
        _record("integro_de", "node", 2, train_seconds=50.0, hardware="H100", device="cuda"),
        _record("integro_de", "anode", 0, train_seconds=9.0, hardware="EPYC"),
    ]

    def expected(systems, device="cpu", hardware=None, method="node"):
        seconds = expected_seconds([systems], method, "", records, device, hardware)
        return None if seconds is None else seconds - FIXED_SECONDS

    assert expected(["integro_de"], hardware="EPYC") == 500.0  # this CPU's own record
    assert expected(["spiral_dde"], hardware="EPYC") == 500.0  # its method's on this CPU
    assert expected(["spiral_dde"], hardware="Opteron") == 1200.0  # its system's, any CPU
    assert expected(["mackey_glass_dde"], hardware="Opteron") == 1000.0  # every CPU's
    assert expected(["integro_de"]) == 750.0  # its system's two CPU records: 1000 and 500
    assert expected(["integro_de"], "cuda:0", "EPYC") == 50.0  # the kind of device first
    assert expected(["integro_de"], method="latent_ode") is None
    assert expected_seconds([], "node", "", records, "cpu") is None


@pytest.mark.parametrize(
    ("packs", "workers", "training"),
    [
        ([["a", "b", "c"]], 1, 300.0),  # one pack: its slowest member's time
        ([["b", "c"], ["a"]], 2, 300.0),  # two packs on two workers: the longer
        ([["a"], ["b"], ["c"]], 1, 600.0),  # one by one on one worker: their sum
        ([["a"], ["b"], ["c"]], 2, 300.0),  # on two: longest first, each to the first free
        ([["c"], ["b"], ["a"], ["b"]], 2, 400.0),  # 300 + 100 beside 200 + 200
    ],
)
def test_a_group_takes_its_packs_time_spread_over_the_workers(packs, workers, training):
    """Packed members train at once, so a pack takes its slowest cell's time (a packed record
    holds its pack's time); packs, and cells that train one by one, spread over the workers
    as the engine runs them: a one-by-one model's group of three cells on one worker takes
    three cells' time, not one's."""
    seconds = {"a": 300.0, "b": 200.0, "c": 100.0}
    records = [_record(s, "latent_ode", 0, train_seconds=t) for s, t in seconds.items()]
    got = expected_seconds(packs, "latent_ode", "", records, "cpu", "some CPU", workers)
    assert got == FIXED_SECONDS + training


def test_a_group_expected_to_overrun_the_time_limit_is_not_started(tmp_path, mlflow_store):
    """The ledger's own records say a node seed takes 28 min on this kind of device: with 10
    minutes left it is not started (nothing trains, nothing is recorded), and said."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(epochs=2))
    selection = {"config_file": config, "systems": ["integro_de"], "methods": ["node"]}
    scope = ledger_scope(config, ["integro_de"], ["node"])
    (cell,) = scope.select(seeds=[0])
    ledger = tmp_path / "ledger.jsonl"
    append_records(
        ledger, [_record("integro_de", "node", 0, config_hash=cell.config_hash, train_seconds=1680)]
    )
    said: list[str] = []
    out = run_ledger(ledger, selection=selection, execution={}, max_seconds=600, say=said.append)
    assert out.todo == 4 and not out.appended and not out.stopped
    assert out.skipped == [f"node seed {s} on integro_de" for s in (1, 2, 3, 4)]
    assert "ledger: not starting node seed 1 on integro_de: about 29 min, 10 min left" in said


def test_a_group_whose_cells_add_up_on_its_one_worker_past_the_limit_is_not_started(
    tmp_path, mlflow_store
):
    """The records say a node cell of either system takes under 7 minutes, but the two systems
    train as two packs and the config runs one worker: about 14 minutes together, so with 10
    left the group is not started (a single cell's time would have let it start, and both
    cells would have been stopped unfinished)."""
    ledger, selection = _two_systems(tmp_path, [0])
    append_records(
        ledger,
        [_record(s, "node", 1, train_seconds=400.0) for s in ("integro_de", "spiral_dde")],
    )
    said: list[str] = []
    out = run_ledger(ledger, selection=selection, execution={}, max_seconds=600, say=said.append)
    group = "node seed 0 on integro_de, spiral_dde"
    assert not out.appended and out.skipped == [group]
    assert f"ledger: not starting {group}: about 14 min, 10 min left" in said


def test_without_records_a_time_limited_group_trains_the_packs_this_machine_measures_fit(
    tmp_path, mlflow_store, prefect_server, monkeypatch
):
    """No record says how long node takes here: the packs the engine would train are measured
    (the probes, here a stand-in: integro_de's pack 100 s, spiral_dde's 10 000 s). With 10
    minutes left the spiral pack cannot finish, so only integro_de's cell is trained (and
    recorded), spiral_dde's is not started, and both are said."""
    import tasks.machine.placement
    from tasks.machine.placement import Probe

    def probe(cell, device, members=1):
        per_pack = 100.0 if cell.system == "integro_de" else 10_000.0
        return Probe(per_pack / members / cell.training.epochs)

    monkeypatch.setattr(tasks.machine.placement, "probe_pack", probe)
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))  # its own probe cache
    ledger, selection = _two_systems(tmp_path, [0])
    said: list[str] = []
    out = run_ledger(ledger, selection=selection, execution={}, max_seconds=600, say=said.append)
    assert [(r.system, r.seed) for r in read_ledger(ledger)] == [("integro_de", 0)]
    assert not out.stopped and not out.failed
    group = "node seed 0 on integro_de, spiral_dde"
    assert out.skipped == [f"1 of the 2 cells of {group}"]
    assert (
        f"ledger: 1 of 2 cells of {group} fit (about 203 min by this machine's measurement, "
        "10 min left)" in said
    )
    assert "ledger: training node seed 0 on integro_de (about 3 min expected)" in said


@pytest.mark.heavy  # packs probed in processes
@pytest.mark.parametrize(("cores", "skipped"), [(1, ["1 of the 2 cells of {group}"]), (2, [])])
def test_measured_packs_count_the_workers_this_machine_has_cores_for(
    tmp_path, mlflow_store, prefect_server, monkeypatch, cores, skipped
):
    """No record; each of the two packs measures 240 s. The config asks for two workers: on two
    cores the packs train side by side and the group fits the 10 minutes left; on one core
    they take turns (about 10.4 min with the margin), so only the first pack's cell trains."""
    import tasks.machine
    import tasks.machine.placement
    from tasks.machine.placement import Probe

    monkeypatch.setattr(
        tasks.machine.placement,
        "probe_pack",
        lambda cell, device, members=1: Probe(240.0 / members / cell.training.epochs),
    )
    monkeypatch.setattr(tasks.machine, "usable_cores", lambda: cores)
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))  # its own probe cache
    ledger, selection = _two_systems(tmp_path, [0])
    out = run_ledger(
        ledger, selection=selection, execution={"max_workers": 2}, max_seconds=600, say=print
    )
    group = "node seed 0 on integro_de, spiral_dde"
    assert out.skipped == [s.format(group=group) for s in skipped]
    assert len(read_ledger(ledger)) == cores


@pytest.mark.parametrize(
    ("seconds", "why"),
    [
        (1000.0, "about 41 min by this machine's measurement, 10 min left"),
        (math.inf, "this machine's probe could not train a pack of it (e.g. out of memory)"),
    ],
)
def test_a_group_whose_every_pack_overruns_is_not_started(
    tmp_path, mlflow_store, monkeypatch, seconds, why
):
    """No record, and this machine's measurement says each pack needs more than the time left
    (or its probe failed, as out of memory does): nothing is trained, and the run says why."""
    import tasks.machine.placement
    from tasks.machine.placement import Probe

    monkeypatch.setattr(
        tasks.machine.placement,
        "probe_pack",
        lambda cell, device, members=1: Probe(seconds / members),
    )
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))  # its own probe cache
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(epochs=2))
    selection = {"config_file": config, "systems": ["integro_de"], "methods": ["node"]}
    said: list[str] = []
    ledger = tmp_path / "ledger.jsonl"
    out = run_ledger(
        ledger, selection=selection | {"seeds": [0]}, execution={}, max_seconds=600,
        say=said.append,
    )  # fmt: skip
    assert not read_ledger(ledger) and out.skipped == ["node seed 0 on integro_de"]
    assert f"ledger: not starting node seed 0 on integro_de: {why}" in said


def test_on_a_gpu_the_records_give_way_to_this_machines_measurement(
    tmp_path, mlflow_store, monkeypatch
):
    """The ledger's records say a node cell takes a second, but on a GPU a record is one pack's
    time while packs in lanes add up: the measurement decides (here, too long to start)."""
    import tasks.machine.placement
    from tasks.machine.placement import Probe

    tasks.machine.placement.machine_fingerprint()  # this machine's, cached before CUDA is faked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        tasks.machine.placement,
        "probe_pack",
        lambda cell, device, members=1: Probe(1000.0 / members),
    )
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))  # its own probe cache
    ledger, selection = _two_systems(tmp_path, [0])
    append_records(ledger, [_record("integro_de", "node", 4, train_seconds=1.0, device="cuda")])
    said: list[str] = []
    out = run_ledger(
        ledger, selection=selection, execution={"device": "cuda"}, max_seconds=600,
        say=said.append,
    )  # fmt: skip
    assert len(read_ledger(ledger)) == 1 and out.skipped == [
        "node seed 0 on integro_de, spiral_dde"
    ]
    assert any("by this machine's measurement, 10 min left" in line for line in said)


_PAIR_A, _PAIR_B = ("spiral_dde", "lotka_volterra_dde"), ("mackey_glass_dde", "integro_de")


@pytest.mark.parametrize(
    ("device", "left", "expected"),
    [
        # on CUDA one part per pack, one after another: each pays the fixed cost
        ("cuda", 1000, [(_PAIR_A, 165), (_PAIR_B, 165)]),
        ("cuda", 200, [(_PAIR_A, 165)]),  # the first pack only
        ("cuda", 100, []),
        # on the CPU the two packs train at once on the two workers: the whole group
        ("cpu", 1000, [(_PAIR_A + _PAIR_B, 165)]),
        ("cpu", 100, []),
    ],
)
def test_a_measured_group_is_cut_to_its_packs_that_fit_and_gpu_packs_go_one_by_one(
    device, left, expected
):
    """:func:`flows.ledger.fitting_parts` on two measured packs of 100 s each (two systems ×
    two seeds each): the fixed cost and the margin allowed for, the packs that fit, as parts a
    benchmark can run (systems × seeds), one per pack on CUDA."""
    from flows.ledger import ESTIMATE_MARGIN, FIXED_SECONDS, fitting_parts
    from tasks.engine import PackEstimate

    assert FIXED_SECONDS + ESTIMATE_MARGIN * 100 == 165  # the figures below
    systems = _PAIR_A + _PAIR_B
    cells = paper_config(systems=list(systems), methods=["anode"], seeds=[0, 1]).cells()
    packs = [[c for c in cells if c.system in pair] for pair in (systems[:2], systems[2:])]
    estimates = [PackEstimate(tuple(p), device, 100.0) for p in packs]
    group = LedgerGroup("anode", "", (0, 1), systems)
    parts = fitting_parts(group, estimates, left, workers=2)
    assert [(p.systems, needed) for p, needed in parts] == expected
    assert all(p.seeds == (0, 1) and p.method == "anode" for p, _ in parts)


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        ({("a", 0), ("a", 1), ("b", 0), ("b", 1)}, (("a", "b"), (0, 1))),
        ({("a", 0), ("a", 1), ("b", 0)}, (("a",), (0, 1))),  # 2 cells either way: all seeds
        ({("a", 0), ("b", 0), ("c", 0), ("a", 1)}, (("a", "b", "c"), (0,))),
        ({("b", 1)}, None),  # no first seed: nothing
        (set(), None),
    ],
)
def test_the_part_of_a_group_is_its_largest_product_of_systems_and_first_seeds(cells, expected):
    group = LedgerGroup("node", "", (0, 1), ("a", "b", "c"))
    part = group.largest_part(cells)
    assert (part and (part.systems, part.seeds)) == expected or (part is None and expected is None)


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


@pytest.mark.heavy  # a ledger run killed -9 mid-cell (the time limit's stop stays)
def test_kill9_mid_run_keeps_the_finished_records(tmp_path, prefect_api):
    """``ledger run`` killed while its second cell trains: the first cell's record is in the
    ledger, nothing of the second, and ``status`` says which one is missing."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(epochs=30))
    ledger = tmp_path / "ledger.jsonl"
    env = {**os.environ, "NLLAB_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    env["PREFECT_API_URL"] = prefect_api
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT"):
        env.pop(var, None)
    sel = ["--ledger", str(ledger), "--config", str(config), "--methods", "node"]
    sel += ["--systems", "integro_de", "--seeds", "0", "1"]
    proc = _nllab("ledger", "run", *sel, "--nice", "0", env=env)
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
    assert "Table 3: 1 of 2 selected cells recorded" in out
    assert "node needs 1: seed 1 of integro_de" in out


def _a_value(option: argparse.Action) -> list[str]:
    """The command-line words giving ``option`` a value other than its default."""
    if option.nargs == 0:  # a switch: the spelling that changes it
        return [option.option_strings[-1] if option.default is None else option.option_strings[0]]
    if option.choices:
        return [option.option_strings[0], next(c for c in option.choices if c != option.default)]
    return [option.option_strings[0], "1" if option.default != 1 else "2"]


def test_every_option_of_an_action_is_refused_by_the_others(capsys):
    """Whatever option a group declares, any other action given it stops with one line naming
    the option and the actions it belongs to (none is silently ignored)."""
    parser = argparse.ArgumentParser()
    scoped = add_parser(parser.add_subparsers()).get_default("scoped")
    assert {o.dest for o, _ in scoped} >= {"training", "max_hours", "nice", "pack", "readme"}
    for option, actions in scoped:
        for action in {"status", "run", "record", "table"} - set(actions):
            assert main(["ledger", action, *_a_value(option)]) == 2, (option.dest, action)
            err = capsys.readouterr().err
            assert f"{'/'.join(option.option_strings)} applies to 'nllab ledger " in err, err
    assert main(["ledger", "status", "--max-hours", "1"]) == 2
    assert "--max-hours applies to 'nllab ledger run' only" in capsys.readouterr().err


def test_record_equality_survives_a_round_trip():
    r = _record(note="n")
    assert LedgerRecord.from_mapping(json.loads(r.to_json())) == r == replace(r)
    timed = replace(r, train_seconds=900.0, train_cpu_seconds=450.5)
    assert LedgerRecord.from_mapping(json.loads(timed.to_json())) == timed


def test_the_cpu_seconds_follow_the_wall_seconds_and_older_lines_stay_as_they_were():
    """A line without CPU seconds is written as before the field existed; with them, they
    follow the wall time they qualify."""
    old = _record(train_seconds=900.0)
    assert "train_cpu_seconds" not in json.loads(old.to_json())
    assert LedgerRecord.from_mapping(json.loads(old.to_json())).train_cpu_seconds is None
    keys = list(json.loads(replace(old, train_cpu_seconds=450.0).to_json()))
    assert keys[keys.index("train_seconds") + 1] == "train_cpu_seconds"
    assert [k for k in keys if k != "train_cpu_seconds"] == list(json.loads(old.to_json()))


@pytest.mark.parametrize(
    ("wall", "cpu", "device", "timed"),
    [
        (900.0, 450.0, "cpu", 450.0),  # one thread under load: what the run itself took
        (900.0, 1700.0, "cpu", 900.0),  # several threads: their CPU time adds up past the wall
        (900.0, None, "cpu", 900.0),  # an older record: the wall time
        (900.0, 450.0, "cuda", 900.0),  # a GPU's host thread waits on the device
        (None, 450.0, "cpu", None),
    ],
)
def test_a_records_planning_time_is_the_lesser_of_its_wall_and_cpu_seconds_on_the_cpu(
    wall, cpu, device, timed
):
    r = replace(_record(), train_seconds=wall, train_cpu_seconds=cpu, device=device)
    assert r.timed_seconds == timed


def test_status_and_table_read_without_torch_mlflow_or_prefect(tmp_path):
    """Once today's cells are cached for this code state, ``status`` and ``table`` read the
    ledger with the standard library, pandas and pydantic: no torch, MLflow or Prefect."""
    # the scopes the two commands read (Table 3's and the studies'), computed once in this
    # session's home (or read), as a first `ledger status` of the code state would
    assert main(["ledger", "status"]) == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = (
        "import sys; from flows.cli import main; "
        "codes = [main(['ledger', a]) for a in ('status', 'table')]; "
        "print(codes, sorted(m for m in ('torch', 'mlflow', 'prefect') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.splitlines()[-1] == "[0, 0] []", done.stdout[-2000:] + done.stderr
    assert "computing today's config hashes" not in done.stderr


def test_a_cells_numerics_are_those_of_its_model_as_the_profile_sets_it(tmp_path, monkeypatch):
    """The ablation's Neural Laplace (``stereographic = false``) and the paper profile's
    Neural Flows (linear time functions) run code their models' defaults do not reach: their
    records' model fingerprints are those of that code, not of the defaults', at the system's
    state dimension; and the data set's is that of the profile's split (normalised on every
    trajectory, as the reference code does), not of the default split's."""
    from nltrain.numerics import model_fingerprint, system_fingerprint
    from tasks.ledger import cell_numerics

    monkeypatch.setenv("NLLAB_HOME", str(tmp_path))  # fingerprints computed afresh
    one = {"systems": ["integro_de"], "seeds": [0]}
    (plain,) = paper_config(methods=["neural_laplace"], **one).cells()
    (ablated,) = paper_config(
        methods=["neural_laplace"], models={"neural_laplace": {"stereographic": False}}, **one
    ).cells()
    (flow,) = paper_config(methods=["nf_resnet"], **one).cells()
    plain_fp, ablated_fp, flow_fp = (cell_numerics(c).split("/")[0] for c in (plain, ablated, flow))
    assert plain_fp == model_fingerprint("neural_laplace", None, 1)  # integro_de is 1-D
    assert plain_fp != model_fingerprint("neural_laplace", None, 2)
    assert ablated_fp == model_fingerprint("neural_laplace", {"stereographic": False}, 1)
    assert ablated_fp != plain_fp
    assert flow.model == {"time_net": "linear"}
    assert flow_fp == model_fingerprint("nf_resnet", {"time_net": "linear"}, 1)
    assert flow_fp != model_fingerprint("nf_resnet", None, 1)
    assert plain.data.normalise_on == "all"
    split_fp = cell_numerics(plain).split("/")[1]
    all_ = {"normalise_on": "all"}
    assert split_fp == system_fingerprint("integro_de", all_) != system_fingerprint("integro_de")


@pytest.mark.parametrize("value", ["-1", "20", "low"])
def test_a_niceness_outside_0_to_19_is_a_usage_error(value, capsys):
    """A negative niceness would raise the run's priority (which needs privileges), and Linux
    caps it at 19: both are refused in one line before anything runs."""
    with pytest.raises(SystemExit) as stopped:
        main(["ledger", "run", "--nice", value])
    assert stopped.value.code == 2
    assert f"argument --nice: a niceness from 0 to 19, got '{value}'" in capsys.readouterr().err
