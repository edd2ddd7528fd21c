"""The records the tracking package hands out: the platform's own frozen views of stored runs.

No MLflow object leaves :mod:`tasks.tracking`: :class:`~tasks.tracking.Queries` reads MLflow's
runs and answers with these (a finished cell, any run such as a command's parent run), so the
rest of the code never reads MLflow's entity layout (``run.data.tags``, ``run.info.run_id``).
No MLflow import here: code that only names a record stays light.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tasks.tracking.tags import RunTags

__all__ = ["RunRecord", "StoredRun"]


def _numerics(tags: Mapping[str, str]) -> tuple[str, str] | None:
    model, system = tags.get(RunTags.NUMERICS_MODEL), tags.get(RunTags.NUMERICS_SYSTEM)
    return (model, system) if model and system else None


def _int_tag(tags: Mapping[str, str], name: str) -> int | None:
    try:
        return int(tags[name])
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class StoredRun:
    """A run as the store holds it, of any kind: a cell, a command's parent run (benchmark,
    study, tune, reproduce), a trial. ``metrics`` are each metric's latest value; ``start_time``
    is in milliseconds since the epoch, as MLflow records it."""

    run_id: str
    status: str  # RUNNING, SCHEDULED, FINISHED, FAILED or KILLED
    start_time: int
    tags: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)
    artifact_uri: str | None = None
    #: soft-deleted (restorable in the MLflow UI until ``mlflow gc`` purges it)
    deleted: bool = False

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED"

    @property
    def kind(self) -> str | None:
        """``benchmark``, ``study:NAME``, ``tune``, ``reproduce``, ``trial`` or ``cell``."""
        return self.tags.get(RunTags.KIND)

    @property
    def profile(self) -> str | None:
        return self.tags.get(RunTags.PROFILE)

    @property
    def parent_run_id(self) -> str | None:
        return self.tags.get(RunTags.PARENT)

    @property
    def numerics(self) -> tuple[str, str] | None:
        """A cell run's numerics fingerprints ``(model, system)`` (:attr:`RunRecord.numerics`)."""
        return _numerics(self.tags)

    @property
    def experiment_hash(self) -> str | None:
        """A benchmark's experiment (its configuration without execution settings)."""
        return self.tags.get(RunTags.EXPERIMENT_HASH)

    @property
    def cells_hash(self) -> str | None:
        """A benchmark's cells: a hash of their config hashes (``None`` before it was tagged)."""
        return self.tags.get(RunTags.CELLS_HASH)

    @property
    def cells(self) -> int | None:
        """How many cells a command's parent run had (``None``: not recorded)."""
        return _int_tag(self.tags, RunTags.CELLS)

    @property
    def cells_with_results(self) -> int | None:
        """How many of a command's cells finished or were reused (``None``: not recorded)."""
        done = _int_tag(self.tags, RunTags.CELLS_FINISHED)
        reused = _int_tag(self.tags, RunTags.CELLS_REUSED)
        return None if done is None and reused is None else (done or 0) + (reused or 0)


@dataclass(frozen=True)
class RunRecord:
    """A finished cell found in the store: its run, config hash, test RMSE, tags and metrics."""

    run_id: str
    config_hash: str
    test_rmse: float | None
    tags: Mapping[str, str]
    metrics: Mapping[str, float] = field(default_factory=dict)
    artifact_uri: str | None = None
    start_time: int = 0

    @property
    def parent_run_id(self) -> str | None:
        """The command's run that trained the cell (a reused cell keeps its first parent)."""
        return self.tags.get(RunTags.PARENT)

    @property
    def numerics(self) -> tuple[str, str] | None:
        """The numerics fingerprints ``(model, system)`` of the code that trained the cell
        (:mod:`tasks.machine.numerics`), or ``None`` for a run stored before they were recorded."""
        return _numerics(self.tags)

    @property
    def git_commit(self) -> str | None:
        return self.tags.get(RunTags.GIT_COMMIT)
