"""Where studies live: an Optuna RDB storage (an embedded sqlite file under
``data_home()/"optuna"`` by default, any SQLAlchemy URL otherwise) with heartbeats, so the trial
of a killed process is failed when the study is next opened and retried once; and opening a
study with its seeded sampler and its pruner."""

from __future__ import annotations

import random
import shlex
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import sqlalchemy
import sqlalchemy.exc
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial

from tasks.stopping import hold_stop, release_stop
from tasks.tracking import claim_owner
from tasks.tuning.spec import OBJECTIVE, OWNER_ATTR, StorageUnavailable, TuneSpec, TuningError
from tasks.tuning.storage_urls import default_storage_url, redact, storage_url_problem

__all__ = [
    "OwnedStudy",
    "TrialSeededTPE",
    "dashboard_command",
    "default_storage_url",
    "grace_seconds",
    "has_heartbeat",
    "open_storage",
    "open_study",
    "redact",
]

_SCHEMA_ATTEMPTS = 6  # opening a fresh server database: tries before giving up


def open_storage(
    url: str | None = None, *, heartbeat_seconds: int = 30, grace_seconds: int | None = None
) -> RDBStorage:
    """An RDB storage with heartbeats; stale trials are failed and retried once.

    sqlite waits up to 60 s for a lock instead of failing (parallel trials, several processes).
    Processes that open one fresh server database together race to create its tables
    (neither PostgreSQL's nor sqlite's ``CREATE TABLE`` checks and creates atomically); the
    losers retry, and then find the schema in place.
    """
    url = url or default_storage_url()
    if url == default_storage_url():
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    elif (problem := storage_url_problem(url)) is not None:
        raise TuningError(problem)
    if url.startswith("sqlite:"):
        engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    for attempt in range(1, _SCHEMA_ATTEMPTS + 1):
        try:
            with warnings.catch_warnings():
                # Heartbeats are marked experimental since Optuna 2.9; they resume a study.
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_seconds,
                    grace_period=grace_seconds,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
                )
        except Exception as e:
            if attempt == _SCHEMA_ATTEMPTS or not _lost_schema_race(e):
                first = str(e).splitlines()[0] if str(e) else ""
                if isinstance(e, sqlalchemy.exc.OperationalError):
                    raise StorageUnavailable(
                        f"cannot reach the Optuna storage {redact(url)!r}: {first}"
                    ) from e
                raise TuningError(
                    f"cannot open the Optuna storage {redact(url)!r}: {type(e).__name__}: "
                    f"{first}. Use an SQLAlchemy URL such as sqlite:////ABS/PATH/optuna.db or "
                    "postgresql+psycopg2://USER:PASSWORD@HOST:5432/optuna (with the driver "
                    "installed)"
                ) from e
            # Jitter so that two losers of one race do not collide again.
            time.sleep(0.2 * attempt * (1 + random.random()))
    raise AssertionError("unreachable: the last attempt returns or raises")


def grace_seconds(storage: RDBStorage) -> float:
    """How long a trial of ``storage`` may go without a heartbeat before it counts as dead:
    its grace period, else twice the heartbeat interval (as Optuna's ``fail_stale_trials``)."""
    if storage.grace_period is not None:
        return float(storage.grace_period)
    return 2.0 * (storage.heartbeat_interval or 0)


def has_heartbeat(storage: RDBStorage, trial_id: int) -> bool:
    """Whether trial ``trial_id`` ever recorded a heartbeat (Optuna's ``trial_heartbeats``
    table; ``fail_stale_trials`` judges only the trials that did)."""
    query = sqlalchemy.text("SELECT 1 FROM trial_heartbeats WHERE trial_id = :trial")
    with storage.engine.connect() as connection:
        return connection.execute(query, {"trial": trial_id}).first() is not None


def _lost_schema_race(error: Exception) -> bool:
    """Whether ``error`` is another process creating the same tables or rows at the same time."""
    if not isinstance(error, sqlalchemy.exc.DBAPIError):
        return False
    if isinstance(error, (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError)):
        return True  # duplicate key in the catalog or in version_info; table already there
    return "already exists" in str(error) or "database is locked" in str(error)


def dashboard_command(url: str) -> str:
    """The command that opens the Optuna dashboard on ``url`` (password hidden)."""
    return f"optuna-dashboard {shlex.quote(redact(url))}"


def _pruner(spec: TuneSpec, epochs: int) -> optuna.pruners.BasePruner:
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(epochs, 1))
    # Not before a quarter of the epochs: early curves of good and bad trials cross.
    return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=epochs // 4)


class TrialSeededTPE(optuna.samplers.TPESampler):
    """TPE whose random state is reseeded from ``(seed, trial number)`` before each trial.

    The storage gives every trial of a study a unique number, so processes sharing a study never
    draw the same random points (one fixed seed per process would make them all draw the same
    sequence), a resumed study does not redraw its first points, and the same study replays
    identically from the same seed.
    """

    def __init__(self, seed: int, **kwargs: Any) -> None:
        super().__init__(seed=seed, **kwargs)
        self._base_seed = seed

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        state = np.random.SeedSequence([self._base_seed, trial.number]).generate_state(1)[0]
        self._rng.rng.seed(int(state))
        self._random_sampler._rng.rng.seed(int(state))
        super().before_trial(study, trial)


class OwnedStudy(optuna.Study):
    """A study whose every trial names the process that runs it (the trial attribute
    :data:`OWNER_ATTR`, from :func:`tasks.tracking.claim_owner`) from the moment it is created
    or taken from the queue, so that a later session can tell a trial of a process that has
    ended.

    While :attr:`hold_starts` is set, a trial's start is one step for Ctrl-C and SIGTERM: the
    signal is held (:func:`tasks.stopping.hold_stop`) from :meth:`ask` until the objective
    calls :func:`tasks.stopping.release_stop` as it begins, inside Optuna's own handling, which
    ends the trial FAIL and stops its heartbeat thread. Cut anywhere before that (in ``ask``,
    or as the heartbeat thread starts, `optuna/study/_optimize.py` ``_run_trial``), the trial
    would stay RUNNING with no owner or heartbeat, or its non-daemon heartbeat thread would beat
    on and keep the process from exiting.
    """

    hold_starts = False

    def ask(self, fixed_distributions: dict | None = None) -> optuna.Trial:
        held = self.hold_starts and hold_stop()
        try:
            trial = super().ask(fixed_distributions)
            trial.set_user_attr(OWNER_ATTR, claim_owner())
        except BaseException:
            if held:
                release_stop()
            raise
        return trial


def open_study(spec: TuneSpec, storage: RDBStorage, epochs: int) -> OwnedStudy:
    """The study of ``spec`` in ``storage`` (created if absent) as an :class:`OwnedStudy`:
    minimising :data:`OBJECTIVE`, sampled by :class:`TrialSeededTPE`, pruned by the spec's
    pruner over ``epochs``."""
    sampler = TrialSeededTPE(seed=spec.seed, n_startup_trials=spec.startup_trials)
    pruner = _pruner(spec, epochs)
    optuna.create_study(
        storage=storage,
        study_name=spec.study_name,
        direction="minimize",
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )
    study = OwnedStudy(spec.study_name, storage, sampler=sampler, pruner=pruner)
    if study.metric_names != [OBJECTIVE]:
        # The objective's name in optuna-dashboard and the study's metadata.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([OBJECTIVE])
    return study
