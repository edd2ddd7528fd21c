"""What a study is asked to do (:class:`TuneSpec`), what it gives back (:class:`TuneResult`),
its errors, and SIGTERM handled as Ctrl-C."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.config import (
    MAX_SEED,
    CellConfig,
    Device,
    Profile,
    RunConfig,
    resolve_config,
)
from tasks.config.run_settings import address_implies_dask, checked_dask_address
from tasks.errors import SettingError, Unreachable
from tasks.stopping import Stopped, stop_signals
from tasks.tuning.search_spaces import Suggestion

__all__ = [
    "BEST_ATTR",
    "OBJECTIVE",
    "OWNER_ATTR",
    "PARENT_ATTR",
    "StorageUnavailable",
    "TuneResult",
    "TuneSpec",
    "TuneTerminated",
    "TuningError",
    "sigterm_interrupts",
    "study_name",
]

#: What every study minimises: the validation RMSE of the trial (normalised units).
OBJECTIVE = "val_rmse"
#: Study user attribute holding the best configuration (see :func:`tasks.tuning.tuned_overrides`).
BEST_ATTR = "best"
#: Study user attribute holding the study's MLflow parent run id.
PARENT_ATTR = "mlflow_parent_run_id"
#: Trial user attribute naming the process that runs it (``tasks.tracking.claim_owner``).
OWNER_ATTR = "owner"


class TuningError(SettingError):
    """A study cannot be opened or has no usable result; the message says why."""


class StorageUnavailable(TuningError, Unreachable):
    """The Optuna storage is well named but cannot be reached or written (a server that does
    not answer, a full disk): a fault of the environment, not of the command."""


#: SIGTERM during a study: handled as Ctrl-C (the running trial ends FAIL, the parent run
#: KILLED), so that a terminated study resumes like an interrupted one; exit code 143.
TuneTerminated = Stopped


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM (and Ctrl-C) raise :class:`~tasks.stopping.Stopped` in the
    main thread (:func:`tasks.stopping.stop_signals`); outside the main thread, nothing
    changes."""
    with stop_signals():
        yield


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
    seed: int = Field(0, ge=0, le=MAX_SEED, description="TPE sampler seed")
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

    _address_implies_dask = model_validator(mode="before")(address_implies_dask)
    _scheduler_address = field_validator("dask_address")(checked_dask_address)

    @field_validator("storage")
    @classmethod
    def _openable_storage(cls, url: str | None) -> str | None:
        """A storage that cannot be opened is refused with the spec (a schedule when it is
        loaded, not at its first run); the default one is made when first opened."""
        from tasks.tuning.storage_urls import default_storage_url, storage_url_problem

        if not url or url == default_storage_url():
            return url or None
        if (problem := storage_url_problem(url)) is not None:
            raise ValueError(problem)
        return url

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
