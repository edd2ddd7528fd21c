"""Test-set scores: the paper's test RMSE (normalised scale, predicted half) and its
diagnostics (physical scale, per dimension, the share of the largest errors, divergence)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nlmodels import ForecastModel
from nltrain._loop import EpochRecord
from nltrain._training import predict

__all__ = [
    "DIVERGED_RMSE_FACTOR",
    "DOMINATED_SHARE",
    "Evaluation",
    "divergence",
    "evaluate",
    "outlier_census",
    "rmse",
    "top_error_share",
]


def rmse(pred: np.ndarray, target: np.ndarray, axis: int | tuple[int, ...] | None = None):
    """Root mean squared error, over everything or over ``axis``."""
    return np.sqrt(np.mean((np.asarray(pred) - np.asarray(target)) ** 2, axis=axis))


#: A test score is *dominated* by a few samples when its largest 0.1% of squared errors carry more
#: than this share of the MSE (``test_top_share``); the report flags such cells.
DOMINATED_SHARE = 0.5


def top_error_share(
    pred: np.ndarray, target: np.ndarray, fraction: float = 1e-3
) -> tuple[float, float]:
    """How much of the MSE the largest squared errors carry, and the RMSE without them.

    The squared errors of every value (trajectory × time × dimension) are ranked; the top
    ``ceil(fraction * size)`` of them, at least one, are the *top* samples.  Nothing is dropped
    from the real score: this is a diagnostic shown beside it.

    Returns:
        ``(share, rmse_without_top)``: the top samples' share of the summed squared error (0 when
        every error is 0) and the RMSE of the remaining samples.

    Raises:
        ValueError: shapes differ, fewer than two values, or ``fraction`` outside (0, 1).
    """
    pred, target = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if pred.shape != target.shape:
        raise ValueError(f"pred and target shapes differ: {pred.shape} vs {target.shape}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    sq = np.sort(((pred - target) ** 2).ravel())
    if sq.size < 2:
        raise ValueError(f"need at least two values to set the top ones apart, got {sq.size}")
    k = min(max(1, int(np.ceil(fraction * sq.size))), sq.size - 1)
    total = float(sq.sum())
    share = float(sq[-k:].sum() / total) if total > 0 else 0.0
    return share, float(np.sqrt(sq[:-k].mean()))


def outlier_census(splits, threshold: float = 10.0) -> dict[str, float]:
    """Values beyond ``threshold`` σ of the normalised scale, per split and dimension.

    Args:
        splits: ``{"train": SplitData, ...}``, or a ``Prepared`` (its train, val and test).
            Both windows of each split count: observed (``obs_x``) and predicted (``target``).
        threshold: in units of the normaliser's std (the data are z-scores, so ``|x| > threshold``).

    Returns:
        ``{"outliers_10sigma_{split}_dim{d}": count}`` (the name carries ``threshold``).
    """
    if not isinstance(splits, dict):
        splits = {"train": splits.train, "val": splits.val, "test": splits.test}
    tag = f"{threshold:g}".replace(".", "p")
    out: dict[str, float] = {}
    for name, split in splits.items():
        for part in (split.obs_x, split.target):
            beyond = np.sum(np.abs(np.asarray(part)) > threshold, axis=(0, 1))
            for d, count in enumerate(beyond):
                key = f"outliers_{tag}sigma_{name}_dim{d}"
                out[key] = out.get(key, 0.0) + float(count)
    return out


@dataclass(frozen=True)
class Evaluation:
    """Test RMSE on the normalised scale over the predicted half (the paper's metric) and more."""

    test_rmse: float
    rmse_per_dim: tuple[float, ...]
    test_rmse_physical: float
    rmse_physical_per_dim: tuple[float, ...]
    nfe: int
    #: share of the squared error carried by the largest 0.1% (see :func:`top_error_share`)
    top_share: float = float("nan")
    #: test RMSE without those samples, shown beside the real score (never instead of it)
    rmse_without_top: float = float("nan")

    @property
    def dominated(self) -> bool:
        """The score is carried by a few samples (``top_share > DOMINATED_SHARE``)."""
        return self.top_share > DOMINATED_SHARE


def evaluate(
    model: ForecastModel,
    split,
    normaliser,
    *,
    device: torch.device | str | None = None,
    dtype: str | None = None,
    batch_size: int = 128,
) -> tuple[Evaluation, np.ndarray]:
    """Evaluate on ``split`` (a normalised ``SplitData``); returns scores and predictions
    (``dtype``: the data's, default the model's)."""
    dev = torch.device(device) if device is not None else None
    model.reset_nfe()
    pred = predict(model, split, device=dev, dtype=dtype, batch_size=batch_size)
    nfe = model.nfe
    target = np.asarray(split.target)
    if not np.all(np.isfinite(pred)):
        raise FloatingPointError("the model predicts NaN or infinite values on the test set")
    pred_phys = np.asarray(normaliser.inverse_transform(pred))
    target_phys = np.asarray(normaliser.inverse_transform(target))
    share, without_top = top_error_share(pred, target) if pred.size > 1 else (0.0, 0.0)
    ev = Evaluation(
        test_rmse=float(rmse(pred, target)),
        rmse_per_dim=tuple(float(v) for v in rmse(pred, target, axis=(0, 1))),
        test_rmse_physical=float(rmse(pred_phys, target_phys)),
        rmse_physical_per_dim=tuple(float(v) for v in rmse(pred_phys, target_phys, axis=(0, 1))),
        nfe=int(nfe),
        top_share=share,
        rmse_without_top=without_top,
    )
    return ev, pred


#: A trained model *diverged* when its test RMSE is over this many times the RMS of the test
#: targets (the error of predicting zero, the training mean on the normalised scale).
DIVERGED_RMSE_FACTOR = 100.0


def divergence(history: Sequence[EpochRecord], test_rmse: float, target: np.ndarray) -> str | None:
    """Why a trained model never learned, or ``None`` if it did.

    Two rules, either one enough:

    1. its test RMSE is over :data:`DIVERGED_RMSE_FACTOR` times the RMS of the test targets
       (``target``, normalised): far worse than predicting the mean;
    2. after more than one epoch, its best validation epoch is the first and its last training
       loss is above the first epoch's: training only made it worse.

    Such a model finishes (its run keeps the scores) but is flagged and never registered.
    """
    scale = float(np.sqrt(np.mean(np.square(np.asarray(target, dtype=np.float64)))))
    if not np.isfinite(test_rmse) or test_rmse > DIVERGED_RMSE_FACTOR * max(scale, 1e-12):
        return (
            f"test RMSE {test_rmse:.4g} is over {DIVERGED_RMSE_FACTOR:g}x the data's scale "
            f"({scale:.3g})"
        )
    if len(history) > 1:
        best = min(range(len(history)), key=lambda i: history[i].val_rmse)
        first, last = history[0].train_loss, history[-1].train_loss
        if best == 0 and not last <= first:
            return (
                f"best epoch 0 of {len(history)} and the training loss rose "
                f"({first:.4g} to {last:.4g})"
            )
    return None
