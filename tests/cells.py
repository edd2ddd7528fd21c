"""Small cells the tests share: one config of a cheap system and model, seeded; a tuning study
of a few such cells; a ledger record."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tasks.config import CellConfig, TrainConfig
from tasks.ledger import LedgerRecord

if TYPE_CHECKING:
    from tasks.tuning import TuneSpec

#: The overrides of a toy tuning study: 40 short trajectories, 4 epochs.
TOY = {
    "data": {"n_trajectories": 40, "n_points": 40},
    "training": {"epochs": 4, "batch_size": 8},
    "progress": False,
}


def tiny_cell(seed: int = 0, **overrides) -> CellConfig:
    """A NODE cell of ``integro_de`` on 30 trajectories, 2 epochs; ``overrides`` replace keys."""
    base = {
        "system": "integro_de",
        "method": "node",
        "seed": seed,
        "data": {"n_trajectories": 30},
        "training": TrainConfig(epochs=2, batch_size=8, patience=None),
    }
    return CellConfig.model_validate({**base, **overrides})


def toy_tune_spec(folder: Path, **overrides) -> TuneSpec:
    """A smoke-profile study of Neural Laplace on ``integro_de`` (4 trials, 2 of them random)
    with its Optuna storage in ``folder``; ``overrides`` replace fields."""
    from tasks.tuning import TuneSpec  # Optuna only where a test tunes

    base = {
        "method": "neural_laplace",
        "system": "integro_de",
        "profile": "smoke",
        "n_trials": 4,
        "startup_trials": 2,
        "storage": f"sqlite:///{folder / 'optuna.db'}",
        "overrides": TOY,
    }
    return TuneSpec(**{**base, **overrides})


def ledger_record(system="integro_de", method="neural_laplace", seed=0, **kw) -> LedgerRecord:
    """A ledger record of the cell, 10 s of training on "some CPU"; ``kw`` replace fields."""
    base = dict(
        system=system,
        method=method,
        seed=seed,
        config_hash="h" * 64,
        commit="abc",
        numerics="today",
        test_rmse=0.01,
        best_val_rmse=0.01,
        rmse_without_top=0.01,
        top_share=0.1,
        epochs=1000,
        best_epoch=999,
        train_seconds=10.0,
        device="cpu",
        hardware="some CPU",
        run_id="r" * 32,
    )
    return LedgerRecord(**{**base, **kw})
