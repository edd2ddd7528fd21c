"""Hyperparameter search with Optuna, as plain functions (the Prefect flow is ``flows.tune``).

A study tunes one method on one system at one profile's budget. Trials train on the cell's
training split and are scored by their best validation RMSE (the test split is never looked at);
every epoch is reported to Optuna, so the pruner (median or Hyperband) can stop bad trials early.
A trial whose training diverges (NaN) is pruned and the study goes on.

Studies live in an Optuna RDB storage (:mod:`.storage`): an embedded sqlite file under
``data_home()/"optuna"`` by default, any SQLAlchemy URL (Postgres for several machines)
otherwise. Trials send heartbeats, so the trial of a killed process (``kill -9``) is marked FAIL
when the study is next opened and retried (``RetryFailedTrialCallback``); ``load_if_exists``
resumes the study where it stopped. Each trial (:mod:`.trials`) is a nested MLflow run under the
study's one parent run (:mod:`.parent`; explicit ``parent_run_id``, so parallel trials never mix
runs). The best configuration is stored in the study's user attributes and as
``best_config.json`` on the parent run; :func:`tuned_overrides` reads it back (:mod:`.tuned`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from nlmodels.lazy import lazy_face

# The spec loads at once (pydantic only); the sessions, storage and runs load on first use
# (PEP 562), so a schedules file or the command line checks a ``TuneSpec`` without loading
# Optuna, MLflow or torch.
from tasks.tuning.spec import (
    BEST_ATTR,
    OBJECTIVE,
    OWNER_ATTR,
    PARENT_ATTR,
    StorageUnavailable,
    TuneResult,
    TuneSpec,
    TuneTerminated,
    TuningError,
    sigterm_interrupts,
    study_name,
)

if TYPE_CHECKING:
    from tasks.tuning.parent import study_parent_run
    from tasks.tuning.session import TuneSession
    from tasks.tuning.storage import (
        TrialSeededTPE,
        dashboard_command,
        default_storage_url,
        open_storage,
        redact,
    )
    from tasks.tuning.tuned import TunedCells, TunedOverrides, apply_tuned, tuned_overrides

_LAZY = {
    "study_parent_run": "parent",
    "TuneSession": "session",
    "TrialSeededTPE": "storage",
    "dashboard_command": "storage",
    "default_storage_url": "storage",
    "open_storage": "storage",
    "redact": "storage",
    "TunedCells": "tuned",
    "TunedOverrides": "tuned",
    "apply_tuned": "tuned",
    "tuned_overrides": "tuned",
}

__all__ = [
    "BEST_ATTR",
    "OBJECTIVE",
    "OWNER_ATTR",
    "PARENT_ATTR",
    "StorageUnavailable",
    "TrialSeededTPE",
    "TuneResult",
    "TuneSession",
    "TuneSpec",
    "TuneTerminated",
    "TunedCells",
    "TunedOverrides",
    "TuningError",
    "apply_tuned",
    "dashboard_command",
    "default_storage_url",
    "open_session",
    "open_storage",
    "redact",
    "run_trials",
    "run_tuning",
    "sigterm_interrupts",
    "study_name",
    "study_parent_run",
    "tuned_overrides",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)


def open_session(spec: TuneSpec, parent_run_id: str | None = None) -> TuneSession:
    """Open (or create) the study of ``spec``; the paper point is enqueued in a new study.
    Its trials run under ``parent_run_id``, or inside :func:`study_parent_run`."""
    from tasks.tuning.session import TuneSession

    session = TuneSession(spec, parent_run_id)
    session.enqueue_paper_point()
    return session


def run_tuning(spec: TuneSpec, trials: Callable[[TuneSession], None] | None = None) -> TuneResult:
    """Run the study until it holds ``spec.n_trials`` complete or pruned trials; resumable.

    ``trials`` runs them (None: ``spec.n_jobs`` threads in this process; ``flows.tune``
    passes one that shards them on Dask). The study's parent run lives for this one block:
    FINISHED with the best trial recorded; FAILED when no trial completed; interrupted (Ctrl-C,
    or SIGTERM under :func:`sigterm_interrupts`), the running trial ends FAIL and the parent run
    KILLED, and the next call runs the missing trials under the same parent."""
    from tasks.tuning.parent import finish_study, study_parent_run
    from tasks.tuning.session import TuneSession

    if trials is None:
        trials = TuneSession.run_to_total
    session = open_session(spec)
    with study_parent_run(session) as parent:
        # Inside the flow too: Prefect's engine installs a SIGTERM handler of its own that
        # Optuna does not see as an interruption (the trial would stay RUNNING).
        with sigterm_interrupts():
            trials(session)
        return finish_study(session, parent)


def run_trials(spec: TuneSpec, parent_run_id: str, n_trials: int) -> int:
    """Run ``n_trials`` trials of an opened study in this process (a shard on a Dask worker)."""
    from tasks.tuning.session import TuneSession

    TuneSession(spec, parent_run_id).optimize(n_trials, 1)
    return n_trials
