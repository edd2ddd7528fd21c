"""The study's MLflow parent run: created once, recorded in the study, and resumed by later
sessions and by Dask shards; and the study's result recorded on it."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

from optuna.trial import FrozenTrial, TrialState

from tasks.tracking import Metrics, ParentRun, RunTags, claim_owner, parent_run
from tasks.tuning.search_spaces import Suggestion
from tasks.tuning.session import TuneSession
from tasks.tuning.spec import BEST_ATTR, PARENT_ATTR, TuneResult, TuningError
from tasks.tuning.storage import dashboard_command, redact

__all__ = ["finish_study", "study_parent_run"]

_PARENT_WAIT_SECONDS = 60.0  # how long a process waits for another to create the parent run


@contextmanager
def study_parent_run(session: TuneSession) -> Iterator[ParentRun]:
    """The study's parent run for the block, with ``session`` attached to it: the run recorded
    in the study (reopened, tagged ``resumed``, an earlier session's ``error`` cleared), else a
    new one recorded there. It ends as :func:`tasks.tracking.parent_run` ends it: FINISHED,
    KILLED (Ctrl-C, SIGTERM) or FAILED.

    Processes that open a new study at once take turns (a claim in the tracking store) until
    the parent is recorded, so the first creates it and the others find it.
    """
    claims, spec = session.tracking.claims, session.spec
    study = hashlib.sha256(f"{session.storage_url}\0{spec.study_name}".encode())
    key, owner = f"tune-parent-{study.hexdigest()[:24]}", claim_owner()
    deadline = time.monotonic() + _PARENT_WAIT_SECONDS
    while not claims.claim_cell(key, owner) and time.monotonic() < deadline:
        time.sleep(0.2)  # another process is choosing the parent; past the deadline, go on
    my_turn = True

    def end_turn() -> None:  # once the parent is recorded, or on the way out
        nonlocal my_turn
        if my_turn:
            my_turn = False
            claims.release_cell(key, owner)

    try:
        recorded = _reopen_recorded(session)
        new: dict[str, dict[str, object]] = {
            "params": {
                **session.cell.flat_params(),
                "sampler": "TPE",
                "sampler_seed": spec.seed,
                "pruner": spec.pruner,
                "n_trials": spec.n_trials,
            },
            "tags": {
                RunTags.METHOD: spec.method,
                RunTags.SYSTEM: spec.system,
                RunTags.PROFILE: spec.profile,
                "optuna.study": spec.study_name,
                "optuna.storage": redact(session.storage_url),
                RunTags.DATASET_HASH: session.dataset_hash,
            },
        }
        with parent_run(
            session.tracking.runs,
            f"tune-{spec.study_name}",
            kind="tune",
            resume=recorded,
            params=None if recorded else new["params"],
            tags=None if recorded else new["tags"],
        ) as parent:
            if recorded is None:
                session.study.set_user_attr(PARENT_ATTR, parent.run_id)
            end_turn()
            session.attach(parent.run_id)
            yield parent
    finally:
        end_turn()


def _reopen_recorded(session: TuneSession) -> str | None:
    """The parent run recorded in the study, if it is in this tracking store's experiment,
    made RUNNING again without an earlier session's error; else ``None``."""
    recorded = session.study.user_attrs.get(PARENT_ATTR)
    if not recorded:
        return None
    try:
        return recorded if session.tracking.runs.reopen(recorded) else None
    except Exception:
        return None  # another tracking store: start a parent there


def _value(trial: FrozenTrial) -> float:
    """A complete trial's objective value (a one-objective study's complete trial has one)."""
    assert trial.value is not None, f"trial {trial.number} is complete but has no value"
    return float(trial.value)


def finish_study(session: TuneSession, parent: ParentRun) -> TuneResult:
    """Record the study's best trial (study attribute, ``best_config.json``, metrics and tags of
    the parent run); a :class:`TuningError` if no trial completed."""
    spec, runs, run_id = session.spec, parent.runs, parent.run_id
    done = [t for t in session.study.get_trials(deepcopy=False) if t.state.is_finished()]
    complete = [t for t in done if t.state == TrialState.COMPLETE]
    if not complete:
        raise TuningError(
            f"study {spec.study_name!r} has no completed trial "
            f"({len(done)} finished: all pruned or failed); see the trial runs under "
            f"MLflow parent run {run_id}"
        )
    best = min(complete, key=_value)
    first = min(complete, key=lambda t: t.number)
    overrides = best.user_attrs["overrides"]
    record = {
        "study": spec.study_name,
        "method": spec.method,
        "system": spec.system,
        "profile": spec.profile,
        "trial": best.number,
        "value": best.value,
        "params": best.params,
        "overrides": overrides,
        "mlflow_run_id": best.user_attrs.get("mlflow_run_id"),
    }
    session.study.set_user_attr(BEST_ATTR, record)
    c = session.counts()
    runs.log_text(run_id, json.dumps(record, indent=2, sort_keys=True), "best_config.json")
    runs.log_metrics(
        run_id,
        {
            Metrics.BEST_VAL_RMSE: _value(best),
            Metrics.FIRST_VAL_RMSE: _value(first),
            Metrics.N_TRIALS: len(done),
        },
    )
    runs.set_tags(
        run_id,
        {
            "best_trial": best.number,
            "trials_complete": c[TrialState.COMPLETE],
            "trials_pruned": c[TrialState.PRUNED],
            "trials_failed": c[TrialState.FAIL],
        },
    )
    return TuneResult(
        study_name=spec.study_name,
        storage=redact(session.storage_url),
        parent_run_id=run_id,
        best_trial=best.number,
        best_value=_value(best),
        best=Suggestion.from_json(overrides),
        first_value=_value(first),
        n_complete=c[TrialState.COMPLETE],
        n_pruned=c[TrialState.PRUNED],
        n_failed=c[TrialState.FAIL],
        dashboard=dashboard_command(session.storage_url),
    )
