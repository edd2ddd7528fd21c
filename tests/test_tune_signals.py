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
from pathlib import Path

import optuna
import pytest
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
