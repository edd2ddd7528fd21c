"""Plain, typed experiment functions (simulate, train, evaluate, report, track) and their thin
Prefect task wrappers. Importing this package changes nothing in the process: the modules that
load MLflow, Prefect or Optuna apply the platform's settings first (:mod:`tasks.offline`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks._env import configure_environment

if TYPE_CHECKING:
    from nlmodels import ForecastModel
    from tasks.config import TrackingConfig
    from tasks.modelio import ModelSpec

# Submodules load on first use (PEP 562), so importing ``tasks`` (or ``tasks.config``) does not
# pull in torch, mlflow or prefect: the command line answers ``--help`` before any of them load.
_LAZY = {
    "CellRuntime": "tasks.cell",
    "run_cell": "tasks.cell",
    "simulate_data": "tasks.cell",
    "MAIN_SYSTEMS": "tasks.config",
    "METHODS": "tasks.config",
    "PROFILES": "tasks.config",
    "CellConfig": "tasks.config",
    "ConfigError": "tasks.config",
    "DataConfig": "tasks.config",
    "RunConfig": "tasks.config",
    "TrackingConfig": "tasks.config",
    "TrainConfig": "tasks.config",
    "resolve_config": "tasks.config",
    "Evaluation": "nltrain",
    "evaluate": "nltrain",
    "plot_extrapolation": "tasks.plots",
    "plot_loss_curves": "tasks.plots",
    "ModelSpec": "tasks.modelio",
    "load_model": "tasks.modelio",
    "save_model": "tasks.modelio",
    "PAPER_MAIN_TABLE": "tasks.reporting",
    "CellResult": "tasks.results",
    "ResultsTable": "tasks.reporting",
    "results_table": "tasks.reporting",
    "Promotion": "tasks.tracking",
    "Tracking": "tasks.tracking",
    "connect": "tasks.tracking",
    "TrackingUnavailable": "tasks.tracking",
    "LoopOptions": "nltrain",
    "StepFunction": "nltrain",
    "StopReason": "nltrain",
    "stop_reason": "nltrain",
    "train_loop": "nltrain",
    "EpochRecord": "nltrain",
    "TrainingDiverged": "nltrain",
    "TrainingInterrupted": "nltrain",
    "TrainResult": "nltrain",
    "select_device": "nltrain",
    "train": "nltrain",
    "packable": "nltrain",
    "train_packed": "nltrain",
    # what flows/ uses of the private modules (one face: no package imports another's private
    # module)
    "SystemDeclaration": "tasks._declarations",
    "declared_names": "tasks._declarations",
    "resolve_sources": "tasks._declarations",
    "exclusive": "tasks._filelock",
    "check_models_fit": "tasks.model_memory",
    "DEFAULT_QUICK_EPOCHS": "tasks._names",
    "MODEL_CARDS": "tasks._names",
    "plugin_systems": "tasks._names",
    "MAX_SQLITE_PATH": "tasks._sqlite_faults",
    "path_too_long": "tasks._sqlite_faults",
    "sqlite_problem": "tasks._sqlite_faults",
    "sqlite_storage_problem": "tasks._storage_urls",
    "usable_cores": "tasks._workers",
    "unknown_names": "tasks._config_checks",
}

__all__ = [
    "DEFAULT_QUICK_EPOCHS",
    "MAIN_SYSTEMS",
    "MAX_SQLITE_PATH",
    "METHODS",
    "MODEL_CARDS",
    "PAPER_MAIN_TABLE",
    "PROFILES",
    "CellConfig",
    "CellResult",
    "CellRuntime",
    "ConfigError",
    "DataConfig",
    "EpochRecord",
    "Evaluation",
    "LoopOptions",
    "ModelSpec",
    "Promotion",
    "ResultsTable",
    "RunConfig",
    "StepFunction",
    "StopReason",
    "SystemDeclaration",
    "Tracking",
    "TrackingConfig",
    "TrackingUnavailable",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "check_models_fit",
    "configure_environment",
    "declared_names",
    "evaluate",
    "exclusive",
    "load_model",
    "load_registered_model",
    "packable",
    "path_too_long",
    "plot_extrapolation",
    "plot_loss_curves",
    "plugin_systems",
    "resolve_config",
    "resolve_sources",
    "results_table",
    "run_cell",
    "save_model",
    "select_device",
    "simulate_data",
    "sqlite_problem",
    "sqlite_storage_problem",
    "stop_reason",
    "tracking_uri",
    "train",
    "train_loop",
    "train_packed",
    "unknown_names",
    "usable_cores",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")


def load_registered_model(
    uri: str, tracking: TrackingConfig | None = None, device: str = "cpu"
) -> tuple[ForecastModel, ModelSpec]:
    """Load ``models:/NAME@ALIAS`` from the configured registry as ``(model, ModelSpec)``."""
    import tempfile

    from tasks.modelio import load_model
    from tasks.tracking import connect

    registry = connect(tracking).registry
    # The weights are in memory once loaded: the downloaded copy is not kept.
    with tempfile.TemporaryDirectory(prefix="nllab-model-") as tmp:
        return load_model(registry.download_model(uri, tmp), device=device)


def tracking_uri(tracking: TrackingConfig | None = None) -> str:
    """The MLflow tracking URI the platform logs to: ``MLFLOW_TRACKING_URI`` (or ``mlflow.env``)
    if set, else the embedded store under ``$NLLAB_HOME``. ``mlflow.set_tracking_uri(
    tasks.tracking_uri())`` lets any MLflow client read its runs, models and registry."""
    from tasks.tracking import TrackingSettings

    return TrackingSettings.resolve(tracking).tracking_uri
