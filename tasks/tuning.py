"""Hyperparameter search with Optuna, as plain functions (the Prefect flow is ``flows.tune``).

A study tunes one method on one system at one profile's budget. Trials train on the cell's
training split and are scored by their best validation RMSE (the test split is never looked at);
every epoch is reported to Optuna, so the pruner (median or Hyperband) can stop bad trials early.
A trial whose training diverges (NaN) is pruned and the study goes on.

Studies live in an Optuna RDB storage: an embedded sqlite file under ``data_home()/"optuna"`` by
default, any SQLAlchemy URL (Postgres for several machines) otherwise. Trials send heartbeats,
so the trial of a killed process (``kill -9``) is marked FAIL when the study is next opened and
retried (``RetryFailedTrialCallback``); ``load_if_exists`` resumes the study where it stopped.
Each trial is a nested MLflow run under the study's parent run (explicit ``parent_run_id``, so
parallel trials never mix runs). The best configuration is stored in the study's user attributes
and as ``best_config.json`` on the parent run; :func:`tuned_overrides` reads it back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shlex
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import optuna
import sqlalchemy.exc
import torch
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from datasets import data_home
from tasks.cell import CellRuntime, fit_cells, simulate_data
from tasks.config import (
    CellConfig,
    ConfigError,
    Device,
    Profile,
    RunConfig,
    TrainConfig,
    resolve_config,
)
from tasks.search_spaces import Suggestion, paper_params, search_space, suggest
from tasks.tracking import Tracker, _owner_gone, claim_owner
from tasks.training import EpochRecord, TrainingDiverged, select_device

#: What every study minimises: the validation RMSE of the trial (normalised units).
OBJECTIVE = "val_rmse"

__all__ = [
    "StorageUnavailable",
    "TuneResult",
    "TuneSpec",
    "TuneTerminated",
    "TunedCells",
    "TunedOverrides",
    "TuningError",
    "apply_tuned",
    "dashboard_command",
    "default_storage_url",
    "open_storage",
    "redact",
    "run_trials",
    "run_tuning",
    "sigterm_interrupts",
    "study_name",
    "tuned_overrides",
]

#: Study user attribute holding the best configuration (see :func:`tuned_overrides`).
BEST_ATTR = "best"
PARENT_ATTR = "mlflow_parent_run_id"
#: Trial user attribute naming the process that runs it (``tasks.tracking.claim_owner``).
OWNER_ATTR = "owner"


_PARENT_WAIT_SECONDS = 60.0  # how long a process waits for another to create the parent run
_SCHEMA_ATTEMPTS = 6  # opening a fresh server database: tries before giving up


class TuningError(RuntimeError):
    """A study cannot be opened or has no usable result; the message says why."""


class StorageUnavailable(TuningError):
    """The Optuna storage is well named but cannot be reached or written (a server that does
    not answer, a full disk): a fault of the environment, not of the command."""


class TuneTerminated(KeyboardInterrupt):
    """SIGTERM during a study: handled as Ctrl-C (the running trial ends FAIL, the parent run
    KILLED), so that a terminated study resumes like an interrupted one."""

    exit_code = 143  # 128 + SIGTERM, as the shell reports a process the signal ended


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`TuneTerminated` in the main thread (as SIGINT
    raises ``KeyboardInterrupt``); outside the main thread, nothing changes."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, _frame: Any) -> None:
        raise TuneTerminated(f"terminated by signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class TuneSpec(BaseModel):
    """What to tune and how (validated at the edge: CLI, schedules, flows)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    system: str
    profile: Profile = "smoke"
    n_trials: int = Field(20, ge=1, description="trials (complete or pruned) the study should hold")
    n_jobs: int = Field(1, ge=1, description="trials run at the same time")
    storage: str | None = Field(None, description="SQLAlchemy URL; None: sqlite under data_home()")
    name: str | None = Field(None, description="study name; None: METHOD-SYSTEM-PROFILE")
    seed: int = Field(0, ge=0, description="TPE sampler seed")
    pruner: Literal["median", "hyperband"] = "median"
    startup_trials: int = Field(5, ge=1, description="random trials before TPE models the space")
    start_from_paper: bool = Field(True, description="first trial: the paper's configuration")
    heartbeat_seconds: int = Field(30, ge=1)
    grace_seconds: int | None = Field(None, ge=1, description="None: 2 x heartbeat")
    config_file: str | None = None
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="RunConfig overrides (data, training, tracking, ...)"
    )
    device: Device = "cpu"
    task_runner: Literal["thread", "dask"] = "thread"
    dask_address: str | None = None

    @property
    def study_name(self) -> str:
        return self.name or study_name(self.method, self.system, self.profile)

    def run_config(self) -> RunConfig:
        """The profile's run configuration narrowed to this study's system and method."""
        over = {**self.overrides, "systems": [self.system], "methods": [self.method]}
        return resolve_config(self.profile, self.config_file, over)

    def base_cell(self) -> CellConfig:
        return self.run_config().cells()[0]


def study_name(method: str, system: str, profile: str) -> str:
    return f"{method}-{system}-{profile}"


# -- storage ------------------------------------------------------------------------------------
def default_storage_url() -> str:
    return f"sqlite:///{(data_home() / 'optuna' / 'optuna.db').resolve()}"


def redact(url: str) -> str:
    """The URL with any password hidden (for logs, tags and printed commands)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


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
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
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


# -- results ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TuneResult:
    study_name: str
    storage: str  # redacted
    parent_run_id: str
    best_trial: int
    best_value: float
    best: Suggestion
    first_value: float | None  # value of the study's first finished trial (the paper point)
    n_complete: int
    n_pruned: int
    n_failed: int
    dashboard: str


@dataclass(frozen=True)
class TunedOverrides:
    """The best configuration of a study, as read back from its storage."""

    study_name: str
    best_value: float
    best_trial: int
    model: dict[str, Any]
    training: dict[str, Any]


# -- one study session --------------------------------------------------------------------------
@contextmanager
def _trial_run(tracker: Tracker, name: str, tags: Mapping[str, str], parent: str) -> Iterator[str]:
    """A nested MLflow run that ends FINISHED (complete), KILLED (pruned) or FAILED."""
    run_id = tracker.create_run(name, tags, parent)
    try:
        yield run_id
    except optuna.TrialPruned as e:
        tracker.set_tags(run_id, {"optuna.state": "PRUNED", "pruned_reason": str(e)[:4000]})
        tracker.end_run(run_id, "KILLED")
        raise
    except BaseException as e:
        tracker.set_tags(run_id, {"optuna.state": "FAIL", "error": f"{type(e).__name__}: {e}"})
        tracker.end_run(run_id, "FAILED")
        raise
    tracker.set_tags(run_id, {"optuna.state": "COMPLETE"})
    tracker.end_run(run_id, "FINISHED")


class _StudyFull(RuntimeError):
    """A trial drawn after the study reached its trial count (by another process): failed."""


class _QuietSurplus(logging.Filter):
    """Drops Optuna's "trial failed" warnings (with traceback) about surplus trials."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            return False  # Ctrl-C or SIGTERM: the command says so once, without a traceback
        message = record.getMessage()
        return not any(message.startswith(f"Trial {n} failed") for n in self.numbers)


class _TrialSeededTPE(optuna.samplers.TPESampler):
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


class _Session:
    """An opened study with its data, tracker and parent run (one per process)."""

    def __init__(self, spec: TuneSpec, parent_run_id: str | None = None) -> None:
        search_space(spec.method)  # unknown method: clear error before anything is created
        self.spec = spec
        self.config = spec.run_config()
        self.cell = self.config.cells()[0]
        self.storage_url = spec.storage or default_storage_url()
        self.storage = open_storage(
            self.storage_url,
            heartbeat_seconds=spec.heartbeat_seconds,
            grace_seconds=spec.grace_seconds,
        )
        self.study = optuna.create_study(
            storage=self.storage,
            study_name=spec.study_name,
            direction="minimize",
            sampler=_TrialSeededTPE(seed=spec.seed, n_startup_trials=spec.startup_trials),
            pruner=_pruner(spec, self.cell.training.epochs),
            load_if_exists=True,
        )
        if self.study.metric_names != [OBJECTIVE]:
            # The objective's name in optuna-dashboard and the study's metadata.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self.study.set_metric_names([OBJECTIVE])
        select_device(spec.device)  # CUDA asked for but absent: a clear error up front
        ds = simulate_data(self.cell.system, self.cell.data, self.cell.seed)
        self.dataset_hash = ds.fingerprint
        self.tracker = Tracker.connect(self.config.tracking)
        self.parent_run_id = parent_run_id or self._parent_run()
        self.runtime = CellRuntime.for_config(
            self.tracker, self.config, self.parent_run_id, device=spec.device, progress=False
        )
        self._attr_lock = threading.Lock()

    def _parent_run(self) -> str:
        """The study's MLflow parent run: the one recorded in the study, else a new one.

        Processes that open a new study at once take turns (a claim in the tracking store),
        so the first creates the parent and the others find it recorded.
        """
        study = hashlib.sha256(f"{self.storage_url}\0{self.spec.study_name}".encode())
        key, owner = f"tune-parent-{study.hexdigest()[:24]}", claim_owner()
        deadline = time.monotonic() + _PARENT_WAIT_SECONDS
        while not self.tracker.claim_cell(key, owner) and time.monotonic() < deadline:
            time.sleep(0.2)  # another process is choosing the parent; past the deadline, go on
        try:
            return self._recorded_or_new_parent()
        finally:
            self.tracker.release_cell(key, owner)

    def _recorded_or_new_parent(self) -> str:
        recorded = self.study.user_attrs.get(PARENT_ATTR)
        if recorded:
            try:
                run = self.tracker.get_run_data(recorded)
                if run.info.experiment_id == self.tracker.experiment_id:
                    self.tracker.set_tags(recorded, {"resumed": "true"})
                    if "error" in run.data.tags:  # the error of an earlier, ended session
                        self.tracker.client.delete_tag(recorded, "error")
                    if run.info.status != "RUNNING":
                        self.tracker.client.update_run(recorded, status="RUNNING")
                    return recorded
            except Exception:
                pass  # another tracking store: start a parent there
        tags = {
            "nllab.kind": "tune",
            "method": self.spec.method,
            "system": self.spec.system,
            "profile": self.spec.profile,
            "optuna.study": self.spec.study_name,
            "optuna.storage": redact(self.storage_url),
            "dataset_hash": self.dataset_hash,
        }
        run_id = self.tracker.create_run(f"tune-{self.spec.study_name}", tags)
        self.tracker.log_params(
            run_id,
            {
                **self.cell.flat_params(),
                "sampler": "TPE",
                "sampler_seed": self.spec.seed,
                "pruner": self.spec.pruner,
                "n_trials": self.spec.n_trials,
            },
        )
        self.study.set_user_attr(PARENT_ATTR, run_id)
        return run_id

    # -- trials -------------------------------------------------------------------------------
    def counts(self) -> dict[TrialState, int]:
        trials = self.study.get_trials(deepcopy=False)
        return {s: sum(t.state == s for t in trials) for s in TrialState}

    def remaining(self) -> int:
        c = self.counts()
        return max(0, self.spec.n_trials - c[TrialState.COMPLETE] - c[TrialState.PRUNED])

    def enqueue_paper_point(self) -> None:
        if self.spec.start_from_paper and not self.study.trials:
            self.study.enqueue_trial(paper_params(self.spec.method), user_attrs={"origin": "paper"})

    def objective(self, trial: optuna.Trial) -> float:
        s = suggest(trial, self.spec.method)
        cell = self.cell.model_copy(
            update={
                "model": {**self.cell.model, **s.model},
                "training": TrainConfig.model_validate(
                    {**self.cell.training.model_dump(), **s.training}
                ),
            }
        )
        trial.set_user_attr("overrides", s.as_json())
        trial.set_user_attr(OWNER_ATTR, claim_owner())
        tags = {
            "nllab.kind": "trial",
            "method": self.spec.method,
            "system": self.spec.system,
            "profile": self.spec.profile,
            "optuna.study": self.spec.study_name,
            "optuna.trial": str(trial.number),
            "origin": str(trial.user_attrs.get("origin", "sampler")),
        }
        with _trial_run(self.tracker, f"trial-{trial.number}", tags, self.parent_run_id) as run:
            trial.set_user_attr("mlflow_run_id", run)
            self.tracker.log_params(run, {f"hp.{k}": v for k, v in trial.params.items()})

            def report(_member: int, r: EpochRecord) -> None:
                trial.report(r.val_rmse, r.epoch)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at epoch {r.epoch}: val_rmse {r.val_rmse}")

            # The same set-up and training path as every benchmark cell; the test split is not
            # evaluated (the objective is the best validation RMSE).
            (out,) = fit_cells([cell], self.runtime, [run], on_epoch=report, evaluate_test=False)
            if isinstance(out, TrainingDiverged):
                # Pruned, not failed: the sampler then learns that this region is bad.
                trial.set_user_attr("diverged", str(out))
                raise optuna.TrialPruned(f"diverged: {out}") from out
            if isinstance(out, Exception):
                raise out
            result = out.train
            self.tracker.log_metrics(
                run,
                {
                    "best_val_rmse": result.best_val_rmse,
                    "best_epoch": result.best_epoch,
                    "train_seconds": result.seconds,
                },
            )
            return result.best_val_rmse

    def optimize(self, n_trials: int, n_jobs: int) -> None:
        if n_trials <= 0:
            return
        threads = self.config.execution.torch_threads
        if threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self.fail_dead_trials()
        total = self.spec.n_trials
        counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        # A surplus trial is expected when processes share the study: no warning with traceback.
        quiet = _QuietSurplus()

        def within_total(trial: optuna.Trial) -> float:
            # Other processes may share the study: the storage numbers trials uniquely, so the
            # trials counted before this one decide whether it is one too many.
            before = self.study.get_trials(deepcopy=False, states=counted)
            if sum(t.number < trial.number for t in before) >= total:
                self.study.stop()
                quiet.numbers.add(trial.number)
                trial.set_user_attr("surplus", True)
                raise _StudyFull(f"the study already holds its {total} trials")
            return self.objective(trial)

        def stop_when_full(study: optuna.Study, _: FrozenTrial) -> None:
            if len(study.get_trials(deepcopy=False, states=counted)) >= total:
                study.stop()

        optuna_log = logging.getLogger("optuna.study._optimize")
        optuna_log.addFilter(quiet)
        try:
            self.study.optimize(
                within_total,
                n_trials=n_trials,
                n_jobs=n_jobs,
                # Any other error fails only its trial; the study goes on (the run keeps it).
                catch=(Exception,),
                callbacks=[stop_when_full],
                gc_after_trial=False,
            )
        finally:
            optuna_log.removeFilter(quiet)

    def fail_dead_trials(self) -> list[int]:
        """Fail (and re-enqueue) the RUNNING trials whose process is gone: at once for a process
        of this host that has ended, by heartbeat (no beat for the grace period) for any other.
        Returns the numbers of the trials failed here."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        failed = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = t.user_attrs.get(OWNER_ATTR)
            if owner and _owner_gone(owner):
                try:
                    self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                except RuntimeError:
                    continue  # finished (or failed by another process) meanwhile
                failed.append(t.number)
                self.study.enqueue_trial(
                    t.params, user_attrs={"origin": str(t.user_attrs.get("origin", "sampler"))}
                )
        return failed

    def run_to_total(self) -> None:
        """Run trials until the study holds ``spec.n_trials`` finished (complete or pruned)
        ones. A trial RUNNING in another process keeps its place while it runs; should the study
        still fall short once this process's trials are done (that trial failed, or its process
        died), this process waits for those trials (failing them by heartbeat once stale) and
        runs the missing ones, for as long as each round adds a finished trial."""
        self.optimize(self.remaining(), self.spec.n_jobs)
        while (missing := self.remaining()) > 0:
            if self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                time.sleep(min(self.spec.heartbeat_seconds, 5))
                self.fail_dead_trials()
                continue
            self.optimize(missing, self.spec.n_jobs)
            if self.remaining() == missing:
                return  # every trial of the round failed: the study ends short, as reported

    def end_parent(self, error: BaseException) -> None:
        """End the parent run because of ``error``: KILLED for Ctrl-C, SIGTERM or any other
        interruption that is not an error (a ``BaseException`` such as Prefect's termination
        signal), else FAILED with the error as its tag."""
        try:
            self.tracker.set_tags(self.parent_run_id, {"error": f"{type(error).__name__}: {error}"})
            killed = not isinstance(error, Exception)
            self.tracker.end_run(self.parent_run_id, "KILLED" if killed else "FAILED")
        except Exception:  # the store itself may be what failed; the error is reported anyway
            logging.getLogger(__name__).debug("could not end the parent run", exc_info=True)

    def finish(self) -> TuneResult:
        done = [t for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()]
        complete = [t for t in done if t.state == TrialState.COMPLETE]
        if not complete:
            self.tracker.set_tags(self.parent_run_id, {"error": "no trial completed"})
            self.tracker.end_run(self.parent_run_id, "FAILED")
            raise TuningError(
                f"study {self.spec.study_name!r} has no completed trial "
                f"({len(done)} finished: all pruned or failed); see the trial runs under "
                f"MLflow parent run {self.parent_run_id}"
            )
        best = min(complete, key=lambda t: t.value)
        first = min(complete, key=lambda t: t.number)
        overrides = best.user_attrs["overrides"]
        record = {
            "study": self.spec.study_name,
            "method": self.spec.method,
            "system": self.spec.system,
            "profile": self.spec.profile,
            "trial": best.number,
            "value": best.value,
            "params": best.params,
            "overrides": overrides,
            "mlflow_run_id": best.user_attrs.get("mlflow_run_id"),
        }
        self.study.set_user_attr(BEST_ATTR, record)
        c = self.counts()
        self.tracker.log_text(
            self.parent_run_id, json.dumps(record, indent=2, sort_keys=True), "best_config.json"
        )
        self.tracker.log_metrics(
            self.parent_run_id,
            {"best_val_rmse": best.value, "first_val_rmse": first.value, "n_trials": len(done)},
        )
        self.tracker.set_tags(
            self.parent_run_id,
            {
                "best_trial": best.number,
                "trials_complete": c[TrialState.COMPLETE],
                "trials_pruned": c[TrialState.PRUNED],
                "trials_failed": c[TrialState.FAIL],
            },
        )
        self.tracker.end_run(self.parent_run_id, "FINISHED")
        return TuneResult(
            study_name=self.spec.study_name,
            storage=redact(self.storage_url),
            parent_run_id=self.parent_run_id,
            best_trial=best.number,
            best_value=float(best.value),
            best=Suggestion.from_json(overrides),
            first_value=float(first.value),
            n_complete=c[TrialState.COMPLETE],
            n_pruned=c[TrialState.PRUNED],
            n_failed=c[TrialState.FAIL],
            dashboard=dashboard_command(self.storage_url),
        )


def open_session(spec: TuneSpec, parent_run_id: str | None = None) -> _Session:
    """Open (or create) the study of ``spec``; the paper point is enqueued in a new study."""
    session = _Session(spec, parent_run_id)
    session.enqueue_paper_point()
    return session


def run_tuning(spec: TuneSpec) -> TuneResult:
    """Run the study until it holds ``spec.n_trials`` complete or pruned trials; resumable.

    Interrupted (Ctrl-C, or SIGTERM under :func:`sigterm_interrupts`), the running trial ends
    FAIL and the parent run KILLED; the next call runs the missing trials."""
    session = open_session(spec)
    try:
        # Inside the flow too: Prefect's engine installs a SIGTERM handler of its own that
        # Optuna does not see as an interruption (the trial would stay RUNNING).
        with sigterm_interrupts():
            session.run_to_total()
    except BaseException as e:
        session.end_parent(e)
        raise
    return session.finish()


def run_trials(spec: TuneSpec, parent_run_id: str, n_trials: int) -> int:
    """Run ``n_trials`` trials of an opened study in this process (a shard on a Dask worker)."""
    session = _Session(spec, parent_run_id)
    session.optimize(n_trials, 1)
    return n_trials


# -- reading the result back ---------------------------------------------------------------------
def tuned_overrides(
    method: str, system: str, profile: str, storage: str | None = None, name: str | None = None
) -> TunedOverrides | None:
    """The best configuration of a finished study, or ``None`` if there is no such study."""
    url = storage or default_storage_url()
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return None
    name = name or study_name(method, system, profile)
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError:
        return None
    best = study.user_attrs.get(BEST_ATTR)
    if not best:
        return None
    return TunedOverrides(
        study_name=name,
        best_value=float(best["value"]),
        best_trial=int(best["trial"]),
        model=dict(best["overrides"]["model"]),
        training=dict(best["overrides"].get("training", {})),
    )


@dataclass(frozen=True)
class TunedCells:
    config: RunConfig  # the run with each tuned (system, method) in ``cell_overrides``
    cells: tuple[CellConfig, ...]
    tuned: tuple[str, ...]  # cell keys that use a study's best configuration
    untuned: tuple[str, ...]  # cell keys with no finished study (paper configuration)


def apply_tuned(
    config: RunConfig, storage: str | None = None, profile: str | None = None
) -> TunedCells:
    """``config`` with the best configuration of the study of each (method, system).

    Studies are looked up at ``profile`` (default: the config's own). A pair with no finished
    study keeps its configuration. Explicit per-method overrides of ``config`` win over tuned ones
    (:meth:`RunConfig.cells`).
    """
    profile = profile or config.profile
    overrides: dict[str, dict[str, Any]] = {}
    studies: dict[str, str] = {}
    for system in config.systems:
        for method in config.methods:
            best = tuned_overrides(method, system, profile, storage)
            if best is not None:
                overrides[f"{system}/{method}"] = {"model": best.model, "training": best.training}
                studies[f"{system}/{method}"] = best.study_name
    try:
        tuned_config = RunConfig.model_validate(
            {**config.model_dump(), "cell_overrides": overrides}
        )
        cells = tuned_config.cells()
    except ValidationError as e:
        raise ConfigError(
            f"the tuned configurations of studies {sorted(studies.values())} do not fit a cell "
            f"config: {e.errors()[0]['msg']}"
        ) from None
    tuned = tuple(c.key for c in cells if f"{c.system}/{c.method}" in overrides)
    untuned = tuple(c.key for c in cells if f"{c.system}/{c.method}" not in overrides)
    return TunedCells(tuned_config, tuple(cells), tuned, untuned)
