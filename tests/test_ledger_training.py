"""``nllab ledger status --training``: the cells a tracking store is training now, their epoch,
their recent pace and the time to their last epoch."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import mlflow
import pytest
from cells import ledger_record
from mlflow.entities import Metric

from flows.cli import main
from flows.ledger import training_now, training_text
from tasks.ledger import append_records, read_ledger
from tasks.ledger.scope import LedgerCell, ledger_scope
from tasks.ledger.views import PACE_EPOCHS, cell_progress
from tasks.tracking import connect
from tasks.tracking.processes import claim_owner, host_id, process_token
from tasks.tracking.tags import Metrics, RunTags

CELL = LedgerCell("integro_de", "node", 0, "a" * 64, None)
PLANNED = {"training.epochs": "1000", "training.patience": "None"}


def test_the_pace_is_the_recent_epochs_and_the_time_to_go_follows_from_it():
    # 40 epochs 10 s apart, then the machine got busy: 30 s apart for the last 25
    times = [(e, 10.0 * e) for e in range(40)]
    times += [(e, times[-1][1] + 30.0 * (e - 39)) for e in range(40, 65)]
    p = cell_progress(CELL, "r1", PLANNED, list(reversed(times)))  # any order
    assert (p.epochs_done, p.epochs, p.may_stop_early) == (65, 1000, False)
    assert p.seconds_per_epoch == pytest.approx(30.0)  # the last PACE_EPOCHS epochs only
    assert PACE_EPOCHS < 25
    assert p.seconds_left == pytest.approx(935 * 30.0)


def test_a_resumed_runs_pace_is_measured_from_its_first_epoch_trained_again():
    # epochs 0-399 came from a checkpoint, logged again within a second; then 12 s apart
    times = [(e, 1000.0 + e / 1000) for e in range(400)]
    times += [(e, times[-1][1] + 12.0 * (e - 399)) for e in range(400, 405)]
    resumed = cell_progress(CELL, "r1", PLANNED, times, resumed_at=400)
    assert resumed.epochs_done == 405 and resumed.seconds_per_epoch == pytest.approx(12.0)
    naive = cell_progress(CELL, "r1", PLANNED, times)  # the replayed epochs counted: too fast
    assert naive.seconds_per_epoch < 4.0
    just = cell_progress(CELL, "r1", PLANNED, times[:400], resumed_at=400)
    assert just.seconds_per_epoch is None  # no epoch trained since: no pace yet


@pytest.mark.parametrize(
    ("params", "times", "epochs", "pace", "early"),
    [
        (PLANNED, [], 1000, None, False),  # no epoch yet
        (PLANNED, [(0, 5.0)], 1000, None, False),  # one epoch: no pace yet
        ({"training.epochs": "50", "training.patience": "9"}, [(0, 0.0), (1, 2.0)], 50, 2.0, True),
        ({"training.max_train_seconds": "3600"}, [(0, 0.0), (2, 2.0)], None, 1.0, True),
    ],
)
def test_what_a_run_does_not_say_is_not_guessed(params, times, epochs, pace, early):
    p = cell_progress(CELL, "r1", params, times)
    assert (p.epochs, p.seconds_per_epoch, p.may_stop_early) == (epochs, pace, early)
    if epochs is None or pace is None:
        assert p.seconds_left is None


def test_the_text_gives_epoch_pace_and_time_to_go():
    running = cell_progress(CELL, "0123456789ab", PLANNED, [(e, 3.0 * e) for e in range(250)])
    early = cell_progress(
        LedgerCell("spiral_dde", "node", 1, "b" * 64, None),
        "fedcba987654",
        {**PLANNED, "training.patience": "10"},
        [(e, 2.0 * e) for e in range(997)],
    )
    text = training_text([running, early], "sqlite:///store.db", now=0.0)
    assert "Training now: 2 of the selected cells (tracking store sqlite:///store.db)" in text
    assert "integro_de/node/seed0  epoch 250/1000  3.0 s/epoch lately  about 38 min to go" in text
    assert "(run 01234567)" in text
    assert "epoch 997/1000  2.0 s/epoch lately  at most 6 s to go" in text  # may stop earlier
    assert "none of the selected cells" in training_text([], "sqlite:///s.db")


def _cell_run(client, experiment: str, config_hash: str, status: str, **tags: str) -> str:
    run = client.create_run(
        experiment,
        tags={RunTags.KIND: "cell", RunTags.CONFIG_HASH: config_hash, **tags},
    )
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(Metrics.TRAIN_LOSS, 1.0, 1_000_000 + 4000 * e, e) for e in range(6)],
        params=[mlflow.entities.Param("training.epochs", "10")],
    )
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status)
    return run.info.run_id


def test_the_store_s_running_cells_are_found_and_those_of_ended_processes_are_not(
    tmp_path, mlflow_store
):
    config = tmp_path / "tiny.toml"
    config.write_text("[training]\nepochs = 10\n")
    cells = ledger_scope(config, ["integro_de"], ["node"]).select(seeds=[0, 1, 2])
    experiment = connect().store.experiment_id  # first: it points MLflow at this test's store
    client = mlflow.MlflowClient()
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    this_host = {RunTags.HOST: host_id()}
    mine = {**this_host, RunTags.PROCESS: process_token(os.getpid())}
    live = _cell_run(client, experiment, cells[0].config_hash, "RUNNING", **mine)
    _cell_run(client, experiment, cells[1].config_hash, "FINISHED")
    orphan = {**this_host, RunTags.PROCESS: f"{ended}:1"}
    left = _cell_run(client, experiment, cells[2].config_hash, "RUNNING", **orphan)
    _cell_run(client, experiment, "c" * 64, "RUNNING")  # not a selected cell

    progress, store = training_now(cells, config_file=config)
    assert [(p.cell.seed, p.run_id, p.epochs_done, p.epochs) for p in progress] == [
        (0, live, 6, 10)
    ]
    assert progress[0].seconds_per_epoch == pytest.approx(4.0)
    assert progress[0].seconds_left == pytest.approx(16.0)
    assert store.startswith("sqlite:")
    # the run of the process that ended was ended when the store was opened
    assert client.get_run(left).info.status == "KILLED"


def test_the_command_prints_them_after_the_status(tmp_path, mlflow_store, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text("[training]\nepochs = 10\n")
    (cell,) = ledger_scope(config, ["integro_de"], ["node"]).select(seeds=[3])
    experiment = connect().store.experiment_id  # first: it points MLflow at this test's store
    client = mlflow.MlflowClient()
    _cell_run(client, experiment, cell.config_hash, "RUNNING")
    args = ["ledger", "status", "--config", str(config), "--systems", "integro_de"]
    args += ["--methods", "node", "--ledger", str(tmp_path / "ledger.jsonl")]
    assert main([*args, "--training"]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path / 'ledger.jsonl'}: no such file yet (0 records)" in out  # a typo shows
    assert "Training now: 1 of the selected cells" in out
    assert "integro_de/node/seed3  epoch 6/10  4.0 s/epoch lately  about 16 s to go" in out
    assert main(args) == 0
    assert "Training now" not in capsys.readouterr().out  # the plain status reads no store
    assert main(["ledger", "table", "--training"]) == 2
    assert main(["ledger", "status", "--report-minutes", "5"]) == 2  # a run's option
    with pytest.raises(SystemExit) as refused:
        main(["ledger", "run", "--report-minutes", "-1"])
    assert refused.value.code == 2
    assert "--report-minutes: a number of minutes 0 or more, got '-1'" in capsys.readouterr().err


def test_a_run_leaves_a_group_another_process_is_training_until_no_other_is_free(
    tmp_path, mlflow_store, monkeypatch
):
    """Seed 0's cell is being trained by another live process: ``ledger run`` trains seed 1
    first (said), then seed 0 (every group left has a running cell: the engine waits on the
    other's claim and reuses its result); with nothing running elsewhere, the ledger's order."""
    import flows.ledger.run as ledger_run
    from flows.ledger import run_ledger

    config = tmp_path / "tiny.toml"
    config.write_text("[training]\nepochs = 10\n")
    cells = ledger_scope(config, ["integro_de"], ["node"]).select(seeds=[0, 1, 2])
    experiment = connect().store.experiment_id
    trained: list[tuple[int, ...]] = []
    monkeypatch.setattr(ledger_run, "_train_group", lambda group, *_: trained.append(group.seeds))
    selection = {
        "config_file": config,
        "systems": ["integro_de"],
        "methods": ["node"],
        "seeds": [0, 1, 2],
    }
    said: list[str] = []
    run_ledger(tmp_path / "ledger.jsonl", selection=selection, execution={}, say=said.append)
    assert trained == [(0,), (1,), (2,)]

    # another run has claimed seed 1's group but not started its cells yet: seed 2 first
    tracking = connect()
    other_run = claim_owner()
    group_1 = ledger_run.group_claim([cells[1].config_hash])
    assert tracking.claims.claim_cell(group_1, other_run)
    trained.clear()
    run_ledger(tmp_path / "claimed.jsonl", selection=selection, execution={}, say=said.append)
    assert trained == [(0,), (2,), (1,)]
    assert any("node seed 1 on integro_de later" in line for line in said)
    assert tracking.claims.claim_holder(group_1) is not None  # still the other run's
    tracking.claims.release_cell(group_1, other_run)
    # this run's own group claims are released as each group ends
    assert tracking.claims.claim_holder(ledger_run.group_claim([cells[2].config_hash])) is None
    said.clear()

    other = {RunTags.HOST: host_id(), RunTags.PROCESS: process_token(os.getpid())}
    client = mlflow.MlflowClient()
    for seed in (0, 2):  # with the numerics a run of today's code tags
        model, system = cells[seed].numerics.split("/")
        numerics = {RunTags.NUMERICS_MODEL: model, RunTags.NUMERICS_SYSTEM: system}
        _cell_run(client, experiment, cells[seed].config_hash, "RUNNING", **other, **numerics)
    trained.clear()
    run_ledger(tmp_path / "ledger.jsonl", selection=selection, execution={}, say=said.append)
    assert trained == [(1,), (0,), (2,)]
    later = [line for line in said if "later: another run is training" in line]
    assert len(later) == 1 and "node seed 0 on integro_de later" in later[0]  # said once

    # the other run finishes seed 0 while this one trains seed 1: recorded, not trained again
    def finish_seed_0(group, *_) -> None:
        trained.append(group.seeds)
        for run in client.search_runs([experiment], "attributes.status = 'RUNNING'"):
            if run.data.tags[RunTags.CONFIG_HASH] == cells[0].config_hash:
                client.log_metric(run.info.run_id, Metrics.TEST_RMSE, 0.25)
                client.set_terminated(run.info.run_id, "FINISHED")

    monkeypatch.setattr(ledger_run, "_train_group", finish_seed_0)
    trained.clear()
    ledger = tmp_path / "second.jsonl"
    run_ledger(ledger, selection=selection, execution={}, say=said.append)
    assert trained == [(1,), (2,)]  # seed 2 still running elsewhere: the engine waits on it
    assert [(r.seed, r.test_rmse) for r in read_ledger(ledger)] == [(0, 0.25)]

    # the other run finishes seed 2 and records it itself while this one trains seed 1
    (seed_0,) = read_ledger(ledger)
    third = tmp_path / "third.jsonl"

    def finish_and_record_seed_2(group, *_) -> None:
        trained.append(group.seeds)
        for run in client.search_runs([experiment], "attributes.status = 'RUNNING'"):
            client.log_metric(run.info.run_id, Metrics.TEST_RMSE, 0.5)
            client.set_terminated(run.info.run_id, "FINISHED")
        c = cells[2]
        append_records(
            third, [replace(seed_0, seed=2, config_hash=c.config_hash, numerics=c.numerics)]
        )

    monkeypatch.setattr(ledger_run, "_train_group", finish_and_record_seed_2)
    trained.clear()
    said.clear()
    run_ledger(third, selection=selection, execution={}, say=said.append)
    assert trained == [(1,)]  # seed 0 from the store at the start, seed 2 the other run's
    assert sorted(r.seed for r in read_ledger(third)) == [0, 2]
    assert not any("seed 2" in line for line in said if line.startswith("ledger: training"))


def test_a_cell_is_held_by_a_record_another_run_appended_at_its_config(tmp_path):
    """What a ledger run counts as recorded by another run meanwhile: what the counting rule
    counts (the same cell at the same config hash, with numerics fingerprints, and with what its
    study measures), as the run chose its cells at its start: a record by other numerics
    holds a cell unless the run retrains those (``refresh_older``)."""
    from flows.ledger.run import LedgerRun, Recorder

    def h(seed: int) -> str:
        return str(seed) * 64

    base = ledger_record("integro_de", "node", 0, config_hash=h(0), numerics="m/s")
    ledger = tmp_path / "ledger.jsonl"
    append_records(ledger, [base, replace(base, seed=1, config_hash=h(1), numerics=None)])
    cmi = replace(base, seed=2, config_hash=h(2), study="cmi", measures={"cmi_bits": 1.0})
    append_records(ledger, [cmi, replace(base, seed=4, config_hash=h(4), study="cmi")])

    def cell(seed: int, numerics: str | None, **kw) -> LedgerCell:
        return LedgerCell("integro_de", "node", seed, h(seed), numerics, **kw)

    def held(cells: list[LedgerCell], refresh_older: bool = False) -> set:
        recorder = Recorder(None, ledger, LedgerRun(), print, refresh_older=refresh_older)  # type: ignore[arg-type]
        return recorder.held(cells)

    assert held(
        [
            cell(0, None),  # numerics not computed by this run: any fingerprinted record
            cell(1, None),  # its record predates fingerprints: trained again
            cell(2, "m/s", study="cmi", measure="cmi_bits"),
            cell(3, None),  # no record
            cell(4, "m/s", study="cmi", measure="cmi_bits"),  # recorded without its measure
        ]
    ) == {("integro_de", "node", "", "", 0), ("integro_de", "node", "cmi", "", 2)}
    assert held([cell(0, "other/numerics")]) == {("integro_de", "node", "", "", 0)}
    assert not held([cell(0, "other/numerics")], refresh_older=True)
