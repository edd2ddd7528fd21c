"""Small cells the tests share: one config of a cheap system and model, seeded."""

from __future__ import annotations

from tasks.config import CellConfig, TrainConfig


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
