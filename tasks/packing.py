"""Placeholder: members trained one by one (replaced by the batched trainer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from nlmodels import ForecastModel
from tasks.config import TrainConfig
from tasks.training import EpochRecord, TrainingDiverged, TrainResult, train

__all__ = ["packable", "train_packed"]


def packable(model: ForecastModel, device: torch.device) -> bool:
    return False


def train_packed(
    models: Sequence[ForecastModel],
    train_splits,
    val_splits,
    config: TrainConfig,
    *,
    device="cpu",
    seeds: Sequence[int],
    on_epoch: Callable[[int, EpochRecord], None] | None = None,
    stop=None,
    progress: bool = False,
    labels: Sequence[str] | None = None,
    graphs: bool | None = None,
) -> list[TrainResult | TrainingDiverged]:
    out: list[TrainResult | TrainingDiverged] = []
    for i, model in enumerate(models):
        cb = None if on_epoch is None else (lambda r, i=i: on_epoch(i, r))
        try:
            out.append(
                train(
                    model,
                    train_splits[i],
                    val_splits[i],
                    config,
                    device=device,
                    seed=seeds[i],
                    on_epoch=cb,
                    stop=stop,
                    progress=progress,
                    label=labels[i] if labels else "train",
                )
            )
        except TrainingDiverged as e:
            out.append(e)
    return out
