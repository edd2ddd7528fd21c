"""Trajectory plots for reports (``plot_trajectories``)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from datasets._simulate import Dataset, check_int


def plot_trajectories(
    ds: Dataset, n: int = 4, n_observed: int | None = None, seed: int = 0
) -> Figure:
    """Plot ``n`` seeded-random trajectories of ``ds``, one panel per state dimension.

    Observed points (the ``n_observed`` points before the prediction window, default T//2, as in
    ``prepare``) are drawn as dots, the predicted half as a line, the noise-free values as a thin
    dashed line when they differ, and a vertical line marks the start of the prediction window.
    Built on ``matplotlib.figure.Figure`` directly: no pyplot state, safe under any backend.
    """
    n = min(check_int("n", n, 1), ds.n_trajectories)
    half = ds.n_points // 2
    n_observed = half if n_observed is None else n_observed
    if not 1 <= n_observed <= half:
        raise ValueError(f"n_observed must be in [1, {half}], got {n_observed}")
    rows = np.sort(np.random.default_rng(seed).choice(ds.n_trajectories, size=n, replace=False))
    obs = slice(half - n_observed, half)
    show_clean = not np.array_equal(ds.x, ds.x_clean)

    fig = Figure(figsize=(7.0, 2.4 * ds.state_dim), layout="constrained")
    axes = fig.subplots(ds.state_dim, 1, sharex=True, squeeze=False)[:, 0]
    for d, ax in enumerate(axes):
        for k, row in enumerate(rows):
            color = f"C{k % 10}"
            ax.plot(
                ds.t[obs],
                ds.x[row, obs, d],
                "o",
                ms=2.5,
                color=color,
                label=f"#{row} observed" if d == 0 else None,
            )
            ax.plot(ds.t[half:], ds.x[row, half:, d], "-", lw=1.2, color=color)
            if show_clean:
                ax.plot(ds.t, ds.x_clean[row, :, d], "--", lw=0.7, color=color)
        ax.axvline(ds.t[half], color="0.4", lw=0.8, ls=":")
        ax.set_ylabel(f"x[{d}]")
    axes[0].set_title(f"{ds.system}: observed (dots) | predicted (line)")
    axes[0].legend(fontsize="x-small", ncols=2, loc="best")
    axes[-1].set_xlabel("t")
    return fig
