"""The names of the run tags and metrics the platform writes and reads, and MLflow's size
limits on them.

No MLflow import: commands that only name tags (or test them) stay light.
"""

from __future__ import annotations

__all__ = [
    "MAX_PARAM",
    "MAX_TAG",
    "METRIC_BATCH",
    "PARAM_BATCH",
    "ExperimentTags",
    "Metrics",
    "RunTags",
]

# MLflow limits: param values 6000 chars, tag values 8000; a batch holds 1000 metrics / 100 params.
MAX_TAG = 5000
MAX_PARAM = 6000
PARAM_BATCH = 100
METRIC_BATCH = 1000


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
    #: Numerics fingerprints of the code that trained a cell (:mod:`tasks.machine.numerics`).
    NUMERICS_MODEL = "numerics.model"
    NUMERICS_SYSTEM = "numerics.system"
    #: Which canaries made those fingerprints (``nltrain.numerics.FINGERPRINT_FORMAT``; absent:
    # format 1).
    NUMERICS_FORMAT = "numerics.format"
    CPU_NUMERICS = "numerics.cpu"  # portable or native CPU arithmetic (nlmodels.numerics)
    #: This machine's bytes against the pinned ones (``nllab doctor``; absent: never checked).
    NUMERICS_PINNED = "numerics.pinned"
    #: Why the CPU numerics are not the mode asked for, what that means for the bytes and the
    #: fix (``nlmodels.numerics_downgrade``; absent: the mode asked for ran).
    NUMERICS_DOWNGRADE = "numerics.downgrade"
    #: Where a cell computed (:func:`tasks.machine.numerics.device_identity`: ``cpu``, or the GPU
    # with
    #: its torch and CUDA versions); absent: the CPU (runs made before the tag existed).
    NUMERICS_DEVICE = "numerics.device"
    #: A hash of a benchmark's experiment (its config without execution settings).
    EXPERIMENT_HASH = "nllab.experiment_hash"
    #: A hash of a benchmark's cells (their config hashes, which never change with the code).
    CELLS_HASH = "nllab.cells_hash"
    ERROR = "error"
    #: Why a finished cell's model never learned (it is flagged and never registered).
    DIVERGED = "diverged"
    RESUMED = "resumed"
    #: A cell resumed from its training checkpoint: the first epoch this run trained (the
    #: earlier ones are the checkpoint's, logged again at once).
    RESUMED_AT_EPOCH = "nllab.resumed_at_epoch"
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


class ExperimentTags:
    """Experiment tags the MLflow UI reads."""

    #: The experiment's kind (which view the UI opens it on) and the model-training kind.
    KIND = "mlflow.experimentKind"
    MODEL_TRAINING = "custom_model_development"
    #: Prefix of a shared view state of the runs page (what the UI's *Share* button saves).
    SHARED_VIEW = "mlflow.sharedViewState."


class Metrics:
    """The names of the run metrics the platform writes and reads back by name (stored runs are
    read by these names: they never change)."""

    TEST_RMSE = "test_rmse"
    TEST_RMSE_PHYSICAL = "test_rmse_physical"
    TEST_RMSE_WITHOUT_TOP = "test_rmse_without_top"
    TEST_TOP_SHARE = "test_top_share"
    TEST_NFE = "test_nfe"
    #: Per epoch (the live loss curve).
    TRAIN_LOSS = "train_loss"
    VAL_LOSS = "val_loss"
    VAL_RMSE = "val_rmse"
    EPOCH_SECONDS = "epoch_seconds"
    NFE = "nfe"
    #: 1.0 when the trained model's test predictions blew up (a flag kept as a metric too).
    DIVERGED = "diverged"
    BEST_VAL_RMSE = "best_val_rmse"
    FIRST_VAL_RMSE = "first_val_rmse"
    BEST_EPOCH = "best_epoch"
    EPOCHS_RUN = "epochs_run"
    TRAIN_SECONDS = "train_seconds"
    #: the training's CPU seconds in its process (:attr:`nltrain.TrainResult.cpu_seconds`)
    TRAIN_CPU_SECONDS = "train_cpu_seconds"
    N_TRIALS = "n_trials"
    REGRESSIONS = "regressions"
    STUDY_SECONDS = "study_seconds"
