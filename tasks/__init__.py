"""Plain, typed experiment functions (simulate, train, evaluate, report, track) and their thin
Prefect task wrappers. Importing this package changes nothing in the process: the modules that
load MLflow, Prefect or Optuna apply the platform's settings first (:mod:`tasks.offline`).

A cell's journey is at the top (:mod:`.cell`, :mod:`.engine`, :mod:`.pipeline`,
:mod:`.prefect_tasks`, :mod:`.results`); each other concern is a room with one face:
:mod:`.config`, :mod:`.tracking`, :mod:`.tuning`, :mod:`.machine` (numerics and how reuse
decides, placement, workers, the doctor's checks), :mod:`.ledger` and :mod:`.reports`. This face
names what a user needs; the rooms' internals are imported from the rooms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlmodels.lazy import lazy_face
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
    "plot_extrapolation": "tasks.reports",
    "plot_loss_curves": "tasks.reports",
    "ModelSpec": "tasks.modelio",
    "load_model": "tasks.modelio",
    "save_model": "tasks.modelio",
    "PAPER_MAIN_TABLE": "tasks.reports",
    "CellResult": "tasks.results",
    "ResultsTable": "tasks.reports",
    "results_table": "tasks.reports",
    "Promotion": "tasks.tracking",
    "Tracking": "tasks.tracking",
    "connect": "tasks.tracking",
    "TrackingUnavailable": "tasks.tracking",
    "run_cells": "tasks.engine",
}

__all__ = [
    "MAIN_SYSTEMS",
    "METHODS",
    "PAPER_MAIN_TABLE",
    "PROFILES",
    "CellConfig",
    "CellResult",
    "CellRuntime",
    "ConfigError",
    "DataConfig",
    "ModelSpec",
    "Promotion",
    "ResultsTable",
    "RunConfig",
    "Tracking",
    "TrackingConfig",
    "TrackingUnavailable",
    "TrainConfig",
    "configure_environment",
    "connect",
    "load_model",
    "load_registered_model",
    "plot_extrapolation",
    "plot_loss_curves",
    "resolve_config",
    "results_table",
    "run_cell",
    "run_cells",
    "save_model",
    "simulate_data",
    "tracking_uri",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)


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
