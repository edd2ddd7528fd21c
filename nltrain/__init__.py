"""The training floor: what turns a cell's data and configuration into weights and scores.

    from nltrain import TrainConfig, seeded, train, evaluate
    with seeded(0):
        model = build_model("node", state_dim=2)           # nlmodels
    result = train(model, prepared.train, prepared.val, TrainConfig(epochs=50))
    scores, forecast = evaluate(model, prepared.test, prepared.normaliser)

The one training loop over a declared step function (:func:`train_loop`, :class:`StepFunction`,
:func:`stop_reason`), one cell's eager step or a pack's batched one (:func:`train`,
:func:`train_packed`), test scores (:func:`evaluate`) and the numerics fingerprints that say
whether a stored cell's numbers are still today's (:func:`model_fingerprint`,
:func:`system_fingerprint`, keyed by every file that can move a number: :func:`covered_sources`).
It imports torch, numpy, pydantic (its settings), ``nlmodels`` and ``datasets``, never Prefect,
MLflow or Optuna: orchestration (cells, engine, tracking) is ``tasks``'.

Names load on first use (PEP 562): ``import nltrain`` imports neither torch nor pydantic, so the
command line, which imports :class:`Interrupted` through ``tasks.errors``, stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nltrain._config import MAX_BATCH, MAX_EPOCHS, Settings, TrainConfig
    from nltrain._errors import Interrupted, TrainingDiverged, TrainingInterrupted
    from nltrain._evaluation import (
        DIVERGED_RMSE_FACTOR,
        DOMINATED_SHARE,
        Evaluation,
        divergence,
        evaluate,
        outlier_census,
        rmse,
        top_error_share,
    )
    from nltrain._fingerprints import (
        model_fingerprint,
        source_key,
        system_fingerprint,
        training_digest,
    )
    from nltrain._loop import (
        EpochRecord,
        LoopOptions,
        StepFunction,
        StopReason,
        TrainResult,
        epoch_bar,
        stop_reason,
        train_loop,
    )
    from nltrain._packing import PlainGRU, PlainGRUCell, packable, prefers_one_by_one, train_packed
    from nltrain._sources import NUMERIC_PACKAGES, covered_sources
    from nltrain._steps import DTYPES, as_tensor
    from nltrain._training import (
        epoch_seconds,
        predict,
        seeded,
        select_device,
        step_function,
        train,
    )

#: Each public name -> the private module that defines it.
_WHERE = {
    **dict.fromkeys(("MAX_BATCH", "MAX_EPOCHS", "Settings", "TrainConfig"), "_config"),
    **dict.fromkeys(("Interrupted", "TrainingDiverged", "TrainingInterrupted"), "_errors"),
    **dict.fromkeys(
        (
            "DIVERGED_RMSE_FACTOR",
            "DOMINATED_SHARE",
            "Evaluation",
            "divergence",
            "evaluate",
            "outlier_census",
            "rmse",
            "top_error_share",
        ),
        "_evaluation",
    ),
    **dict.fromkeys(
        ("model_fingerprint", "source_key", "system_fingerprint", "training_digest"),
        "_fingerprints",
    ),
    **dict.fromkeys(
        (
            "EpochRecord",
            "LoopOptions",
            "StepFunction",
            "StopReason",
            "TrainResult",
            "epoch_bar",
            "stop_reason",
            "train_loop",
        ),
        "_loop",
    ),
    **dict.fromkeys(
        ("PlainGRU", "PlainGRUCell", "packable", "prefers_one_by_one", "train_packed"),
        "_packing",
    ),
    **dict.fromkeys(("NUMERIC_PACKAGES", "covered_sources"), "_sources"),
    **dict.fromkeys(("DTYPES", "as_tensor"), "_steps"),
    **dict.fromkeys(
        ("epoch_seconds", "predict", "seeded", "select_device", "step_function", "train"),
        "_training",
    ),
}

__all__ = [
    "DIVERGED_RMSE_FACTOR",
    "DOMINATED_SHARE",
    "DTYPES",
    "MAX_BATCH",
    "MAX_EPOCHS",
    "NUMERIC_PACKAGES",
    "EpochRecord",
    "Evaluation",
    "Interrupted",
    "LoopOptions",
    "PlainGRU",
    "PlainGRUCell",
    "Settings",
    "StepFunction",
    "StopReason",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "as_tensor",
    "covered_sources",
    "divergence",
    "epoch_bar",
    "epoch_seconds",
    "evaluate",
    "model_fingerprint",
    "outlier_census",
    "packable",
    "predict",
    "prefers_one_by_one",
    "rmse",
    "seeded",
    "select_device",
    "source_key",
    "step_function",
    "stop_reason",
    "system_fingerprint",
    "top_error_share",
    "train",
    "train_loop",
    "train_packed",
    "training_digest",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"nltrain.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'nltrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
