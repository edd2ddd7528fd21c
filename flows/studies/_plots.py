"""Study figures: lines and grouped bars of ``value`` ± std, the paper's figures as crosses."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

__all__ = ["plot_bars", "plot_lines"]


def plot_lines(
    frame: pd.DataFrame,
    x: str,
    hue: str,
    path: Path,
    *,
    title: str,
    ylabel: str = "test RMSE",
    logx: bool = False,
    logy: bool = False,
    panel: str | None = None,
) -> Path:
    """``value`` against ``x`` per ``hue`` (± std), the paper's figures as crosses."""
    panels = list(dict.fromkeys(frame[panel])) if panel else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), squeeze=False)
    for ax, pv in zip(axes[0], panels, strict=True):
        sub = frame if pv is None else frame[frame[panel] == pv]
        for i, (h, g) in enumerate(sub.groupby(hue, sort=False)):
            xs = np.asarray(g[x], dtype=float)
            ax.errorbar(
                xs, g["value"], yerr=g["std"], marker="o", ms=3, label=str(h), color=f"C{i}"
            )
            if "paper" in g and np.isfinite(g["paper"]).any():
                ax.plot(xs, g["paper"], "x", color=f"C{i}", ms=7)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        if logx:  # the levels themselves as ticks, in plain numbers (not 1.4 × 10²)
            ax.set_xscale("log")
            levels = sorted({float(v) for v in sub[x] if np.isfinite(float(v))})
            ax.set_xticks(levels, [f"{v:g}" for v in levels])
            ax.xaxis.set_minor_formatter(NullFormatter())
        if logy and (np.asarray(sub["value"], dtype=float) > 0).any():  # (none: nothing drawn)
            ax.set_yscale("log")
        ax.set_title(str(pv) if pv is not None else "")
        ax.legend(fontsize=7)
    fig.suptitle(f"{title}  (× = paper)")
    fig.tight_layout()
    return _save(fig, path)


def plot_bars(
    frame: pd.DataFrame, x: str, hue: str, path: Path, *, title: str, ylabel: str = "test RMSE"
) -> Path:
    """Grouped bars of ``value`` (± std) per ``x`` and ``hue``; the paper's figures as crosses."""
    xs = list(dict.fromkeys(frame[x]))
    hues = list(dict.fromkeys(frame[hue]))
    width = 0.8 / max(len(hues), 1)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(xs) * max(1, len(hues) / 2)), 3.4))
    for i, h in enumerate(hues):
        g = frame[frame[hue] == h].set_index(x).reindex(xs)
        pos = np.arange(len(xs)) + (i - (len(hues) - 1) / 2) * width
        ax.bar(pos, g["value"], width, yerr=g["std"], label=str(h), color=f"C{i}")
        if "paper" in g:
            ax.plot(pos, g["paper"], "kx", ms=6)
    ax.set_xticks(np.arange(len(xs)), [str(v) for v in xs], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    ax.set_title(f"{title}  (× = paper)")
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
