"""A study ended by SIGTERM or by a process's death resumes to its full trial count: the running
trial ends FAIL (at once for a dead process of this host, by heartbeat for another), the parent
run KILLED and then resumed without the stale error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import torch
from cells import TOY, toy_tune_spec
from optuna.trial import TrialState

from tasks.tracking import claim_owner, connect
from tasks.tuning import OWNER_ATTR, TuneSpec, open_session, open_storage, run_tuning


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _spec(tmp_path: Path, **kw) -> TuneSpec:
    return toy_tune_spec(tmp_path, **{"n_trials": 3, **kw})


def _wait_for_a_running_trial(spec: TuneSpec, proc: subprocess.Popen) -> None:
    storage, deadline = open_storage(spec.storage), time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        try:
            study = optuna.load_study(study_name=spec.study_name, storage=storage)
        except KeyError:
            continue
        running = [t for t in study.trials if t.state == TrialState.RUNNING]
        if running and running[0].intermediate_values:
            return
    raise AssertionError(f"no trial started (exit {proc.poll()})")


# Slow-marked: in 1 of 4 full default runs on a loaded 2-core machine the SIGTERMed process had
# not exited within 60 s (a signal-timing race still to be found); `make test-slow` and the
# `tune-sigterm` probe of benchmarks/reliability.py exercise it.
@pytest.mark.slow
def test_sigterm_mid_trial_then_an_immediate_resume_gives_the_full_trial_count(
    tmp_path, mlflow_store
):
    long = _spec(tmp_path).model_copy(update={"overrides": {**TOY, "training": {"epochs": 400}}})
    script = tmp_path / "study.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, torch; torch.set_num_threads(1)
            from tasks.tuning import TuneSpec, run_tuning
            try:
                run_tuning(TuneSpec.model_validate_json({long.model_dump_json()!r}))
            except KeyboardInterrupt as e:
                sys.exit(getattr(e, "exit_code", 130))
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=os.environ.copy(), stderr=subprocess.PIPE, text=True
    )
    _wait_for_a_running_trial(long, proc)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143, err
    assert "Traceback" not in err, err
    study = optuna.load_study(study_name=long.study_name, storage=long.storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL]
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    tracker = connect()
    parent = tracker.queries.get_run_data(parent_id)
    assert parent.status == "KILLED" and "stopped by SIGTERM" in parent.tags["error"]
    (trial_run,) = tracker.queries.child_runs(parent_id)
    assert trial_run.status == "KILLED"  # interrupted, as every run a stop signal ends

    # At once, well within the heartbeat's grace period: the full count, no trial left over.
    r = run_tuning(_spec(tmp_path))
    assert r.n_complete + r.n_pruned == 3 and r.parent_run_id == parent_id
    trials = optuna.load_study(study_name=long.study_name, storage=long.storage).trials
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials) == 3
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    parent = tracker.queries.get_run_data(parent_id)
    assert parent.status == "FINISHED" and "error" not in parent.tags


def test_a_trial_of_a_dead_process_of_this_host_is_failed_at_once(tmp_path, mlflow_store):
    spec = _spec(tmp_path, heartbeat_seconds=60)  # its heartbeat would not go stale for 2 min
    session = open_session(spec)
    dead = subprocess.run(
        [sys.executable, "-c", "from tasks.tracking import claim_owner; print(claim_owner())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    orphan = session.study.ask()
    orphan.set_user_attr(OWNER_ATTR, dead)
    alive = session.study.ask()
    alive.set_user_attr(OWNER_ATTR, claim_owner())  # this process: still running it
    assert session.fail_dead_trials() == [orphan.number]
    states = {t.number: t.state for t in session.study.trials}
    assert states[orphan.number] == TrialState.FAIL and states[alive.number] == TrialState.RUNNING
    # its configuration is queued again
    waiting = [t for t in session.study.trials if t.state == TrialState.WAITING]
    assert any(t.params == orphan.params for t in waiting)


def test_a_trial_with_no_owner_and_no_heartbeat_is_failed_past_its_grace_and_requeued(
    tmp_path, mlflow_store
):
    """A trial its process left as it started (no owner recorded, no heartbeat sent) would keep
    its place for ever: once it started longer ago than the grace period, it is failed and its
    queued configuration queued again. One that sent a heartbeat is left to Optuna's check."""
    # A grace period of ten minutes, and the trial's start moved an hour back rather than slept
    # past a grace of seconds: a loaded machine could take those seconds between the start and
    # the check that it is still within them (as the claims' tests date a heartbeat back).
    spec = _spec(tmp_path, heartbeat_seconds=60, grace_seconds=600)
    session = open_session(spec)  # the paper point is queued
    (queued,) = session.study.trials
    fixed = queued.system_attrs["fixed_params"]
    plain = open_storage(spec.storage)  # Optuna's own path, as an older process took trials
    study_id = session.study._study_id
    assert plain.set_trial_state_values(queued._trial_id, TrialState.RUNNING)
    beating = plain.create_new_trial(study_id)
    plain.record_heartbeat(beating)
    assert session.fail_dead_trials() == []  # within the grace period: it may be starting
    started = sqlalchemy.text("UPDATE trials SET datetime_start = :at WHERE trial_id = :trial")
    started = started.bindparams(sqlalchemy.bindparam("at", type_=sqlalchemy.DateTime))
    with plain.engine.begin() as db:
        db.execute(started, {"at": datetime.now() - timedelta(hours=1), "trial": queued._trial_id})
    plain.record_heartbeat(beating)  # alive
    assert session.fail_dead_trials() == [queued.number]
    states = {t.number: t.state for t in session.study.trials}
    assert states[queued.number] == TrialState.FAIL
    assert [t.state for t in session.study.trials if t._trial_id == beating] == [TrialState.RUNNING]
    (again,) = [t for t in session.study.trials if t.state == TrialState.WAITING]
    assert again.system_attrs["fixed_params"] == fixed and again.user_attrs["origin"] == "paper"


# Stops the command at the moment a trial starts: a stop signal to itself right after the
# patched step (the trial created, or its heartbeat thread started) as the N-th trial starts.
_STOPPED_AS_A_TRIAL_STARTS = """
import os, signal, sys
import torch
from optuna.storages import RDBStorage
from optuna.storages._heartbeat import HeartbeatThread
torch.set_num_threads(1)
# A user's terminal delivers Ctrl-C; a suite started as a background job inherits SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
step, nth, signame, *command = sys.argv[1:]
owner, name = (RDBStorage, "_create_new_trial") if step == "created" else (HeartbeatThread, "start")
original, calls = getattr(owner, name), []

def stopping(*args, **kwargs):
    value = original(*args, **kwargs)
    calls.append(1)
    if len(calls) == int(nth):
        os.kill(os.getpid(), getattr(signal, signame))
    return value

setattr(owner, name, stopping)
from flows.cli import main
sys.exit(main(command))
"""


@pytest.mark.parametrize(
    ("step", "nth", "signame", "code"),
    [
        pytest.param(
            "created",
            2,
            "SIGINT",
            130,
            marks=pytest.mark.heavy,  # a tune command stopped and resumed in processes
            id="ctrl-c-as-a-trial-is-created",
        ),
        pytest.param(
            "heartbeat",
            2,
            "SIGTERM",
            143,
            marks=pytest.mark.heavy,
            id="sigterm-as-its-heartbeat-starts",
        ),
    ],
)
def test_a_tune_stopped_as_a_trial_starts_ends_it_failed_and_resumes_to_the_end(
    tmp_path, mlflow_store, prefect_api, step, nth, signame, code
):
    """The second trial (the first is the queued paper point) is cut as it starts: the command
    exits at once with the signal's code, that trial FAIL, the parent run KILLED; run again,
    the study runs to its count (it waited for ever for a trial left RUNNING, or the process
    never exited, its heartbeat thread beating on)."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    command = [
        *("tune", "--method", "neural_laplace", "--system", "integro_de", "--trials", "3"),
        *("--profile", "smoke", "--storage", storage, "--epochs", "2"),
    ]
    script = tmp_path / "stopped.py"
    script.write_text(_STOPPED_AS_A_TRIAL_STARTS)
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    run = [sys.executable, str(script), step, str(nth), signame, *command]
    # hang guards (a tune that never exits), not a measure: the two runs, each training
    # trials, took 80 s together at load 12 on 2 cores, so 5 minutes each rather than 2
    stopped = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert stopped.returncode == code, stopped.stderr
    assert "abandoned" not in stopped.stderr and "Traceback" not in stopped.stderr
    study = optuna.load_study(study_name="neural_laplace-integro_de-smoke", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL]
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    assert connect().queries.get_run_data(parent_id).status == "KILLED"

    resumed = subprocess.run(
        [sys.executable, "-m", "flows.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials) == 3
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert connect().queries.get_run_data(parent_id).status == "FINISHED"
