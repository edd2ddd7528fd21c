"""The two per-run figures: a few test trajectories' extrapolation and the loss curves."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are files, never windows
import matplotlib.pyplot as plt
import numpy as np

from nltrain import EpochRecord

__all__ = ["plot_extrapolation", "plot_loss_curves"]

# pyplot and mathtext are not thread-safe: concurrent cells draw one figure at a time.
_PLOT_LOCK = threading.RLock()
_DPI = 110


def _times(t: np.ndarray, i: int) -> np.ndarray:
    t = np.asarray(t)
    return t[i] if t.ndim == 2 else t


def plot_extrapolation(
    split,
    pred: np.ndarray,
    normaliser,
    path: str | Path,
    *,
    title: str = "",
    n_trajectories: int = 4,
) -> Path:
    """Observed prefix, truth and prediction of a few test trajectories (physical units): one
    column per trajectory, one row per state dimension on one scale across the row."""
    with _PLOT_LOCK:
        return _plot_extrapolation(split, pred, normaliser, path, title, n_trajectories)


def _plot_extrapolation(split, pred, normaliser, path, title: str, n_trajectories: int) -> Path:
    obs = np.asarray(normaliser.inverse_transform(np.asarray(split.obs_x)))
    tgt = np.asarray(normaliser.inverse_transform(np.asarray(split.target)))
    prd = np.asarray(normaliser.inverse_transform(pred))
    n = min(n_trajectories, obs.shape[0])
    dims = obs.shape[-1]
    fig, axes = plt.subplots(
        dims, n, figsize=(3.2 * n, 2.4 * dims), squeeze=False, dpi=_DPI, sharex="col", sharey="row"
    )
    for j in range(n):
        for d in range(dims):
            ax = axes[d][j]
            ax.plot(_times(split.obs_t, j), obs[j, :, d], color="0.4", lw=1.2, label="observed")
            ax.plot(_times(split.query_t, j), tgt[j, :, d], color="C0", lw=1.2, label="truth")
            ax.plot(_times(split.query_t, j), prd[j, :, d], "--", color="C3", lw=1.2, label="model")
            # where the observed prefix ends and extrapolation begins
            ax.axvline(_times(split.obs_t, j)[-1], color="0.2", ls=":", lw=1.0)
            if d == 0:
                ax.text(
                    _times(split.obs_t, j)[-1],
                    1.0,
                    " extrapolation →",
                    fontsize=7,
                    transform=ax.get_xaxis_transform(),
                    va="top",
                    ha="left",
                )
            if j == 0:
                ax.set_ylabel(f"x{d}")
            if d == dims - 1:
                ax.set_xlabel("t")
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(title or "extrapolation")
    fig.tight_layout()
    return _save(fig, path)


def plot_loss_curves(history: Sequence[EpochRecord], path: str | Path, *, title: str = "") -> Path:
    """Training loss, validation loss and validation RMSE per epoch (log scale)."""
    with _PLOT_LOCK:
        return _plot_loss_curves(history, path, title)


def _plot_loss_curves(history: Sequence[EpochRecord], path: str | Path, title: str) -> Path:
    from matplotlib.ticker import MaxNLocator

    epochs = [r.epoch for r in history]
    fig, (loss_ax, rmse_ax) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=_DPI)
    for name, colour in (("train_loss", "C0"), ("val_loss", "C1")):
        values = np.array([getattr(r, name) for r in history])
        loss_ax.plot(epochs, values, color=colour, label=name.replace("_", " "))
    # ELBO-type losses may be negative: a log axis would hide them.
    if all(getattr(r, k) > 0 for r in history for k in ("train_loss", "val_loss")):
        loss_ax.set_yscale("log")
    loss_ax.set_ylabel("training objective")
    loss_ax.legend(fontsize=8)
    # RMSE is not the training objective of every model: its own axis, its own scale.
    rmse = np.array([r.val_rmse for r in history])
    rmse_ax.plot(epochs, rmse, color="C2")
    if np.all(rmse > 0):
        rmse_ax.set_yscale("log")
    rmse_ax.set_ylabel("validation RMSE (normalised)")
    for ax in (loss_ax, rmse_ax):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title or "loss curves", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=_DPI)
    plt.close(fig)
    return p
