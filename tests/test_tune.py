"""Optuna studies: search spaces, improvement, nested runs, pruning, divergence, parallel trials
on sqlite, resume after a killed trial, the best config read back for the benchmark."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
import torch
from cells import TOY, toy_tune_spec
from optuna.trial import FixedTrial, TrialState

from nlmodels import build_model
from nltrain import TrainingDiverged
from tasks.config import resolve_config
from tasks.tracking import connect
from tasks.tuning import (
    TuneSpec,
    apply_tuned,
    open_session,
    open_storage,
    run_tuning,
    study_parent_run,
    tuned_overrides,
)
from tasks.tuning.search_spaces import SEARCH_SPACES, Suggestion, paper_params, suggest


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _spec(tmp_path: Path, **kw) -> TuneSpec:
    return toy_tune_spec(tmp_path, **kw)


def _children(parent: str):
    return connect().queries.child_runs(parent)


@pytest.mark.parametrize("method", sorted(SEARCH_SPACES))
def test_paper_point_rebuilds_the_paper_model(method):
    s = suggest(FixedTrial(paper_params(method)), method)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(build_model(method, 2, **s.model)) == count(build_model(method, 2))
    assert s.training == {"lr": 1e-3}
    assert Suggestion.from_json(json.loads(json.dumps(s.as_json()))) == s


def test_study_beats_its_first_trial_and_logs_nested_runs(tmp_path, mlflow_store):
    spec = _spec(tmp_path)
    r = run_tuning(spec)
    assert r.n_complete + r.n_pruned == 4 and r.n_failed == 0
    # The first trial is the paper's configuration; the search must find a better one.
    assert r.first_value is not None and r.best_value < r.first_value
    study = optuna.load_study(study_name=r.study_name, storage=spec.storage)
    assert study.trials[0].params == paper_params("neural_laplace")
    assert study.best_trial.number == r.best_trial
    children = _children(r.parent_run_id)
    assert len(children) == 4
    assert {c.tags["nllab.kind"] for c in children} == {"trial"}
    by_trial = {int(c.tags["optuna.trial"]): c for c in children}
    assert by_trial[r.best_trial].metrics["best_val_rmse"] == pytest.approx(r.best_value)
    t = connect()
    assert t.queries.get_run_data(r.parent_run_id).status == "FINISHED"
    # Best config: study attribute + MLflow artifact, and read back for `benchmark --tuned`.
    best = json.loads(
        (t.queries.download(r.parent_run_id, "best_config.json", tmp_path / "dl")).read_text()
    )
    assert best["trial"] == r.best_trial and best["overrides"] == r.best.as_json()
    assert study.user_attrs["best"]["value"] == pytest.approx(r.best_value)
    tuned = tuned_overrides("neural_laplace", "integro_de", "smoke", spec.storage)
    assert tuned.model == r.best.model and tuned.training == r.best.training
    config = resolve_config(
        "smoke", overrides={"systems": ["integro_de", "spiral_dde"], "methods": ["neural_laplace"]}
    )
    applied = apply_tuned(config, spec.storage)
    assert applied.tuned == ("integro_de/neural_laplace/seed0",)
    assert applied.untuned == ("spiral_dde/neural_laplace/seed0",)
    cell = applied.cells[0]
    assert dict(cell.model) == r.best.model and cell.training.lr == r.best.training["lr"]
    assert applied.cells[1] == config.cells()[1]
    assert r.dashboard == f"optuna-dashboard {spec.storage}"


def test_deliberately_bad_trial_is_pruned(tmp_path, mlflow_store):
    spec = _spec(tmp_path, start_from_paper=False, n_trials=3)
    session = open_session(spec)
    good = {**paper_params("neural_laplace"), "lr": 1e-2}
    bad = {
        "lr": 1e-4,
        "latent_dim": 1,
        "encoder_units": 8,
        "encoder_layers": 1,
        "laplace_units": 16,
    }
    for params in (good, good, bad):
        session.study.enqueue_trial(params)
    with study_parent_run(session):
        session.optimize(3, 1)
    states = [t.state for t in session.study.trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    pruned = session.study.trials[2]
    assert len(pruned.intermediate_values) < 4  # stopped before the last epoch
    run = next(c for c in _children(session.parent_run_id) if c.tags["optuna.trial"] == "2")
    assert run.status == "KILLED" and run.tags["optuna.state"] == "PRUNED"


def test_diverging_trial_is_pruned_and_the_study_goes_on(tmp_path, mlflow_store, monkeypatch):
    import tasks.cell as cell

    real = cell.train_packed
    calls = []

    def first_diverges(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            return [TrainingDiverged("training loss is nan at epoch 0")]
        return real(*args, **kwargs)

    monkeypatch.setattr(cell, "train_packed", first_diverges)
    r = run_tuning(_spec(tmp_path, n_trials=2))
    study = optuna.load_study(study_name=r.study_name, storage=_spec(tmp_path).storage)
    assert [t.state for t in study.trials] == [TrialState.PRUNED, TrialState.COMPLETE]
    assert "nan" in study.trials[0].user_attrs["diverged"]
    assert r.best_trial == 1


def test_the_parent_run_ends_failed_or_killed_and_is_resumed_without_its_error(
    tmp_path, mlflow_store
):
    """One parent run per study across sessions: FAILED when no trial completed, KILLED by
    Ctrl-C, and reopened (tagged ``resumed``, the old error cleared) by the next session."""
    from tasks.tuning import TuningError

    spec = _spec(tmp_path, n_trials=1)
    t = connect()
    with pytest.raises(TuningError, match="no completed trial"):
        run_tuning(spec, trials=lambda session: None)  # a session that ran no trial
    study = optuna.load_study(study_name=spec.study_name, storage=spec.storage)
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    failed = t.queries.get_run_data(parent_id)
    assert failed.status == "FAILED" and "no completed trial" in failed.tags["error"]

    def interrupted(session) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_tuning(spec, trials=interrupted)
    killed = t.queries.get_run_data(parent_id)
    assert killed.status == "KILLED" and killed.tags["resumed"] == "true"
    assert killed.tags["error"].startswith("KeyboardInterrupt")

    r = run_tuning(spec)
    assert r.parent_run_id == parent_id and r.n_complete + r.n_pruned == 1
    done = t.queries.get_run_data(parent_id)
    assert done.status == "FINISHED" and "error" not in done.tags
    assert done.params["n_trials"] == "1" and done.tags["nllab.kind"] == "tune"
    tune_runs = t.store.client.search_runs([t.experiment_id], "tags.`nllab.kind` = 'tune'")
    assert [p.info.run_id for p in tune_runs] == [parent_id]


def test_shards_given_the_parent_run_log_their_trials_under_it(tmp_path, mlflow_store):
    """The Dask path's shape without Dask: shards opened with the study's parent run id (as
    ``flows.tune`` submits them) run their trials under it; the study ends FINISHED."""
    from tasks.tuning import run_trials

    spec = _spec(tmp_path, n_trials=3, start_from_paper=False)

    def in_shards(session) -> None:
        for n in (2, 1):
            run_trials(spec, session.parent_run_id, n)

    r = run_tuning(spec, trials=in_shards)
    assert r.n_complete + r.n_pruned == 3
    assert len(_children(r.parent_run_id)) == 3
    assert connect().queries.get_run_data(r.parent_run_id).status == "FINISHED"


@pytest.mark.heavy  # trials in parallel processes
def test_parallel_trials_on_sqlite(tmp_path, mlflow_store, caplog):
    r = run_tuning(_spec(tmp_path, n_jobs=2, n_trials=4, start_from_paper=False))
    assert r.n_complete + r.n_pruned == 4 and r.n_failed == 0
    assert "database is locked" not in caplog.text
    assert len(_children(r.parent_run_id)) == 4


def test_resume_fails_the_stale_trial_and_keeps_finished_ones(tmp_path, mlflow_store):
    spec = _spec(tmp_path, n_trials=3, heartbeat_seconds=1, grace_seconds=2)
    session = open_session(spec)
    with study_parent_run(session):
        session.optimize(1, 1)
    (done,) = session.study.trials
    # A process killed mid-trial leaves a RUNNING trial whose heartbeat stops.
    storage = open_storage(spec.storage, heartbeat_seconds=1, grace_seconds=2)
    stale = session.study.ask()
    storage.record_heartbeat(stale._trial_id)
    time.sleep(2.5)
    r = run_tuning(spec)
    study = optuna.load_study(study_name=r.study_name, storage=spec.storage)
    trials = study.trials
    assert trials[0].state == done.state and trials[0].value == done.value
    assert trials[stale.number].state == TrialState.FAIL
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == stale.number]
    assert len(retried) == 1 and retried[0].state.is_finished()
    assert r.n_complete + r.n_pruned == 3
    # Trials in MLflow all hang under the study's one parent run.
    assert r.parent_run_id == session.parent_run_id


@pytest.mark.slow
def test_kill_9_mid_trial_then_resume(tmp_path, mlflow_store):
    spec = _spec(tmp_path, n_trials=3, heartbeat_seconds=1, grace_seconds=2)
    spec = spec.model_copy(update={"overrides": {**TOY, "training": {"epochs": 400}}})
    script = tmp_path / "study.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import torch; torch.set_num_threads(1)
            from tasks.tuning import TuneSpec, run_tuning
            run_tuning(TuneSpec.model_validate_json({spec.model_dump_json()!r}))
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], env=os.environ.copy())
    deadline = time.monotonic() + 120
    storage = open_storage(spec.storage)
    while time.monotonic() < deadline:
        time.sleep(1)
        try:
            study = optuna.load_study(study_name=spec.study_name, storage=storage)
        except KeyError:
            continue
        running = [t for t in study.trials if t.state == TrialState.RUNNING]
        if running and running[0].intermediate_values:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # A trial counts as stale once its last heartbeat is older than the grace period.
    time.sleep(spec.grace_seconds + spec.heartbeat_seconds)
    short = spec.model_copy(update={"overrides": TOY})
    r = run_tuning(short)
    trials = optuna.load_study(study_name=spec.study_name, storage=storage).trials
    assert trials[0].state == TrialState.FAIL
    assert r.n_complete + r.n_pruned == 3


def test_cli_tune_prints_the_dashboard_command(tmp_path, mlflow_store, prefect_server, capsys):
    from flows.cli import main

    storage = f"sqlite:///{tmp_path / 'cli.db'}"
    assert (
        main(
            [
                "tune",
                "--method",
                "node",
                "--system",
                "integro_de",
                "--trials",
                "2",
                "--profile",
                "smoke",
                "--storage",
                storage,
                "--epochs",
                "2",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert f"optuna-dashboard {storage}" in out and "best trial" in out
    assert (out + err).count("optuna-dashboard") == 1  # printed once, not by the flow log too
    # NODE's widths are searched as tuples and come back as tuples.
    tuned = tuned_overrides("node", "integro_de", "smoke", storage)
    assert isinstance(tuned.model["hidden"], list | tuple)

    # The hint is the exact command that uses the study: run as printed, it finds it.
    hint = next(line for line in out.splitlines() if line.startswith("use it with: "))
    words = shlex.split(hint.removeprefix("use it with: "))
    assert words[:3] == ["nllab", "benchmark", "--tuned"] and "--profile" in words
    assert main([*words[1:], "--no-register"]) == 0
    out = capsys.readouterr().out
    assert "tuned configurations for 1 cell;" not in out  # the one cell is tuned, none left
    assert out.splitlines()[0] == "tuned configurations for 1 cell"
    run = connect().store.client.search_runs(
        [connect().experiment_id], "tags.method = 'node' and tags.profile = 'smoke'"
    )[0]
    assert json.loads(run.data.params["model.hidden"]) == list(tuned.model["hidden"])


def test_benchmark_tuned_without_a_study_says_what_it_kept_and_where_it_looked(tmp_path):
    from flows.cli.benchmark import tuned_line

    storage = f"sqlite:///{tmp_path / 'none.db'}"
    config = resolve_config("quick", None, {"systems": ["integro_de"], "methods": ["node"]})
    line = tuned_line(apply_tuned(config, storage), "quick", storage)
    assert line.startswith("tuned configurations for 0 cells; 1 cell with no finished")
    assert "keep the quick profile's configuration" in line and "paper" not in line
    assert "node-integro_de-quick" in line and storage in line


def test_unknown_method_or_storage_is_a_clear_error(tmp_path):
    from tasks.tuning import TuningError

    with pytest.raises(ValueError, match="no search space"):
        run_tuning(_spec(tmp_path, method="no_such_model"))
    with pytest.raises(TuningError, match="SQLAlchemy has no database 'nosuchdialect'"):
        open_storage("nosuchdialect://x")


# Passes alone; after another tune flow in the same session it hits a RecursionError inside
# pendulum (Prefect + Dask, under investigation): slow-marked until that is understood.
@pytest.mark.slow
def test_study_shards_on_a_local_dask_cluster(tmp_path, mlflow_store, prefect_server):
    from flows.tune import run_tune, split_trials

    assert split_trials(5, 2) == [3, 2] and split_trials(1, 4) == [1]
    r = run_tune(_spec(tmp_path, n_jobs=2, task_runner="dask"))
    assert r.n_complete + r.n_pruned == 4 and r.n_failed == 0
    assert len(_children(r.parent_run_id)) == 4


def test_processes_starting_one_study_at_once_share_one_parent_run(
    tmp_path, mlflow_store, monkeypatch
):
    """Two sessions choosing the parent run at the same moment: one creates it, the other
    finds it recorded in the study (without the turn-taking both would create one)."""
    import threading
    import time

    spec = _spec(tmp_path)
    sessions = [open_session(spec) for _ in range(2)]
    from tasks.tracking import RunLog

    create_run = RunLog.create_run

    def slow_create_run(self, *args, **kwargs):
        time.sleep(0.5)  # widen the window between "no parent recorded" and recording one
        return create_run(self, *args, **kwargs)

    monkeypatch.setattr(RunLog, "create_run", slow_create_run)
    start_together = threading.Barrier(2)
    chosen: list[str] = []

    def choose(session) -> None:
        start_together.wait()
        with study_parent_run(session) as parent:
            chosen.append(parent.run_id)

    threads = [threading.Thread(target=choose, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(chosen) == 2 and chosen[0] == chosen[1], chosen
    tracker = connect()
    parents = tracker.store.client.search_runs(
        [tracker.experiment_id], "tags.`nllab.kind` = 'tune'"
    )
    assert [p.info.run_id for p in parents] == chosen[:1]
