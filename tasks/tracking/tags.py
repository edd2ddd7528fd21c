"""The names of the run tags the platform writes and reads, and MLflow's size limits on them.

No MLflow import: commands that only name tags (or test them) stay light.
"""

from __future__ import annotations

__all__ = ["RunTags"]

# MLflow limits: param values 6000 chars, tag values 8000; a batch holds 1000 metrics / 100 params.
_MAX_TAG = 5000
_MAX_PARAM = 6000
_PARAM_BATCH = 100
_METRIC_BATCH = 1000


class RunTags:
    """The names of the run tags the platform writes and reads (one place for every command)."""

    KIND = "nllab.kind"  # benchmark, study:<name>, reproduce, tune, trial, cell
    STUDY = "nllab.study"
    PROFILE = "profile"
    SYSTEM = "system"
    METHOD = "method"
    SEED = "seed"
    CONFIG_HASH = "config_hash"
    DATASET_HASH = "dataset_hash"
    #: Numerics fingerprints of the code that trained a cell (:mod:`tasks.numerics`).
    NUMERICS_MODEL = "numerics.model"
    NUMERICS_SYSTEM = "numerics.system"
    CPU_NUMERICS = "numerics.cpu"  # portable or native CPU arithmetic (nlmodels._numerics)
    #: A hash of a benchmark's experiment (its config without execution settings).
    EXPERIMENT_HASH = "nllab.experiment_hash"
    ERROR = "error"
    #: Why a finished cell's model never learned (it is flagged and never registered).
    DIVERGED = "diverged"
    RESUMED = "resumed"
    SOURCE_RUN = "nllab.source_run_id"
    SOURCE_MODEL = "nllab.source_model"
    EXECUTION_PREFIX = "execution."
    CELLS = "cells"
    CELLS_FINISHED = "cells_finished"
    CELLS_REUSED = "cells_reused"
    CELLS_FAILED = "cells_failed"
    PARENT = "mlflow.parentRunId"
    NOTE = "mlflow.note.content"
    GIT_COMMIT = "mlflow.source.git.commit"
    #: Which process owns a run, so a later start can end runs whose process is gone.
    HOST = "nllab.host"
    PROCESS = "nllab.process"
