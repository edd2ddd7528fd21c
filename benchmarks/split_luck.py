"""Is a cell's validation/test gap the model, the data, or the luck of the split?

Reloads a finished cell run's model and data set, predicts every trajectory of its three splits
and writes, under ``--out``:

- ``per_trajectory.csv``: split, trajectory, its initial-condition parameters, its RMSE (normalised
  scale, predicted half) and its largest absolute normalised target value;
- ``per_trajectory.png``: per-trajectory RMSE against the first initial-condition parameter,
  coloured by split;
- ``worst.png``: the worst held-out trajectory beside the training trajectory whose initial
  condition is nearest to it (observed half, truth, prediction; physical units);
- ``resplits.png`` and the printed summary: the validation and test RMSE over random re-splits of
  the 200 held-out trajectories (validation ∪ test, never trained on) into two halves of the same
  sizes; how often a re-split's gap is at least the observed one answers "split luck".

    NLLAB_HOME=... python benchmarks/split_luck.py RUN_ID --out DIR [--resplits 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from nltrain import predict
from tasks.cell import prepare_cell, simulate_data
from tasks.config import CellConfig
from tasks.modelio import load_model
from tasks.tracking import Metrics, connect


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_id")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resplits", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0, help="seed of the random re-splits")
    args = ap.parse_args()
    queries = connect().queries
    run = queries.get_run_data(args.run_id)
    with tempfile.TemporaryDirectory(prefix="nllab-luck-") as tmp:
        cell = CellConfig.model_validate_json(
            queries.download(args.run_id, "config.json", tmp).read_text()
        )
        model, _ = load_model(queries.download(args.run_id, "model", tmp))
    prepared = prepare_cell(cell, simulate_data(cell.system, cell.data, cell.seed))
    args.out.mkdir(parents=True, exist_ok=True)

    rows, sq, preds = [], {}, {}
    for name in ("train", "val", "test"):
        split = getattr(prepared, name)
        pred = preds[name] = predict(model, split, dtype=cell.training.dtype, batch_size=256)
        err = (pred - np.asarray(split.target)) ** 2
        sq[name] = err.mean(axis=(1, 2))  # per-trajectory MSE (equal sizes: the RMSE averages it)
        peak = np.abs(np.asarray(split.target)).max(axis=(1, 2))
        for i, idx in enumerate(split.index):
            rows.append((name, int(idx), *split.ic[i], float(np.sqrt(sq[name][i])), float(peak[i])))
    ic_names = [f"ic{k}" for k in range(prepared.train.ic.shape[1])]
    with open(args.out / "per_trajectory.csv", "w") as f:
        f.write(",".join(["split", "trajectory", *ic_names, "rmse", "max_abs_target"]) + "\n")
        for r in rows:
            f.write(",".join(str(v) for v in r) + "\n")

    val, test = np.sqrt(sq["val"].mean()), np.sqrt(sq["test"].mean())
    logged = run.metrics.get(Metrics.TEST_RMSE)
    print(f"{cell.key}: val RMSE {val:.5f}, test RMSE {test:.5f} (logged test {logged})")
    for name in ("train", "val", "test"):
        r = np.sqrt(sq[name])
        top = np.sort(sq[name])[::-1]
        print(
            f"  {name:5s} n={r.size:4d} RMSE {np.sqrt(sq[name].mean()):.5f}  median traj "
            f"{np.median(r):.5f}  worst traj {r.max():.4f}  share of MSE in worst 5 trajs "
            f"{top[:5].sum() / top.sum():.2f}"
        )

    pool = np.concatenate([sq["val"], sq["test"]])
    n_val = sq["val"].size
    rng = np.random.default_rng(args.seed)
    a = np.empty(args.resplits)
    b = np.empty(args.resplits)
    for k in range(args.resplits):
        perm = rng.permutation(pool.size)
        a[k], b[k] = np.sqrt(pool[perm[:n_val]].mean()), np.sqrt(pool[perm[n_val:]].mean())
    gap = abs(test - val)
    p = float(np.mean(np.abs(b - a) >= gap))
    print(
        f"  re-splits of the {pool.size} held-out trajectories: 90% of halves score "
        f"{np.quantile(a, 0.05):.5f}..{np.quantile(a, 0.95):.5f}; |gap| >= observed "
        f"{gap:.5f} in {p:.1%} of {args.resplits}"
    )

    fig, ax = plt.subplots(figsize=(6, 3.4))
    for name, colour in (("train", "0.7"), ("val", "C0"), ("test", "C3")):
        split = getattr(prepared, name)
        ax.scatter(split.ic[:, 0], np.sqrt(sq[name]), s=6, color=colour, label=name)
    ax.set_yscale("log")
    ax.set_xlabel(ic_names[0] + " (initial-condition parameter)")
    ax.set_ylabel("per-trajectory RMSE")
    ax.set_title(f"{cell.key}: val {val:.4f}, test {test:.4f}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "per_trajectory.png", dpi=110)
    plt.close(fig)

    held = [(sq[n][i], n, i) for n in ("val", "test") for i in range(sq[n].size)]
    _, w_split, w_i = max(held)
    w_ic = getattr(prepared, w_split).ic[w_i]
    n_i = int(np.argmin(np.abs(prepared.train.ic - w_ic).sum(axis=1)))
    norm = prepared.normaliser
    dims = prepared.train.target.shape[-1]
    fig, axes = plt.subplots(dims, 2, figsize=(8, 2.6 * dims), sharey="row", squeeze=False)
    for j, (name, i) in enumerate(((w_split, w_i), ("train", n_i))):
        split = getattr(prepared, name)
        curves = (
            (split.obs_t, split.obs_x[i], "-", "0.4", "observed"),
            (split.query_t, split.target[i], "-", "C0", "truth"),
            (split.query_t, preds[name][i], "--", "C3", "model"),
        )
        for d in range(dims):
            ax = axes[d][j]
            for t, x, style, colour, label in curves:
                ax.plot(t, norm.inverse_transform(x)[:, d], style, color=colour, label=label)
            ax.set_ylabel(f"x{d}")
        axes[0][j].set_title(
            f"{name} trajectory {split.index[i]}, {ic_names[0]} = {split.ic[i, 0]:.4g}: "
            f"RMSE {np.sqrt(sq[name][i]):.4f}",
            fontsize=8,
        )
        axes[-1][j].set_xlabel("t")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "worst.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.hist(np.concatenate([a, b]), bins=60, color="0.6")
    ax.axvline(val, color="C0", label=f"validation {val:.4f}")
    ax.axvline(test, color="C3", label=f"test {test:.4f}")
    ax.set_xlabel("RMSE of a random half of the held-out trajectories")
    ax.set_title(f"{cell.key}: P(|gap| >= observed) = {p:.3f}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "resplits.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
