"""Plain, typed experiment functions (simulate, train, evaluate, report, track) and their thin
Prefect task wrappers. Importing this package turns telemetry off before mlflow/prefect load.
"""

from tasks import _env  # noqa: F401  (must run before mlflow or prefect is imported)
from tasks.cell import CellRuntime, run_cell, simulate_data
from tasks.config import (
    MAIN_SYSTEMS,
    METHODS,
    PROFILES,
    CellConfig,
    ConfigError,
    DataConfig,
    RunConfig,
    TrackingConfig,
    TrainConfig,
    resolve_config,
)
from tasks.evaluation import Evaluation, evaluate, plot_extrapolation, plot_loss_curves
from tasks.modelio import ModelSpec, load_model, save_model
from tasks.packing import packable, train_packed
from tasks.reporting import PAPER_MAIN_TABLE, CellResult, ResultsTable, results_table
from tasks.tracking import Promotion, Tracker, TrackingUnavailable
from tasks.training import (
    EpochRecord,
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    select_device,
    train,
)

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
    "EpochRecord",
    "Evaluation",
    "ModelSpec",
    "Promotion",
    "ResultsTable",
    "RunConfig",
    "Tracker",
    "TrackingConfig",
    "TrackingUnavailable",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "evaluate",
    "load_model",
    "load_registered_model",
    "packable",
    "plot_extrapolation",
    "plot_loss_curves",
    "resolve_config",
    "results_table",
    "run_cell",
    "save_model",
    "select_device",
    "simulate_data",
    "train",
    "train_packed",
]


def load_registered_model(uri: str, tracking: TrackingConfig | None = None, device: str = "cpu"):
    """Load ``models:/NAME@ALIAS`` from the configured registry as ``(model, ModelSpec)``."""
    import tempfile

    tracker = Tracker.connect(tracking)
    # The weights are in memory once loaded: the downloaded copy is not kept.
    with tempfile.TemporaryDirectory(prefix="nllab-model-") as tmp:
        return load_model(tracker.download_model(uri, tmp), device=device)
