"""Neural Laplace on the CPU: a pack of M cells against the same cells one by one.

The paper's Neural Laplace (GRU 2 × 21, K = 2, g hidden 64, 33 Fourier terms), float64, batch
128, Adam with clipping at 1, ``--members`` cells (seeds 0, 1, ...; with ``--systems`` each on
its own time grid, as cells of other systems) trained by ``nltrain.train_packed``: packed
(``vmap`` of the model's plain formulas) and one by one (``pack=False``: each cell alone, on the
native C kernels where they build), in the same process, each from the same initial weights.
Prints seconds per cell-epoch of both and their ratio, and the largest difference between the
two runs' validation RMSEs (packed runs the plain formulas, one by one the fused kernels: the
same maths, so it is rounding). ``--plain`` also times the cells one by one on the plain
formulas (``nlmodels.accel.plain_formulas``): what packing costs over them is ``vmap``'s, the rest
is the fused kernels' advantage.

    PYTHONPATH=. python benchmarks/nl_packing.py --members 5 --epochs 3 --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasets import SplitData
from nlmodels import build_model
from nlmodels.accel import plain_formulas
from nlmodels.accel.native import native_enabled
from nltrain import TrainResult, seeded, train_packed
from tasks.config import TrainConfig


def split(seed: int, n: int, t_obs: int, t_end: float, dim: int = 2) -> SplitData:
    """Damped oscillations of random phase and rate, in the shapes of ``datasets.prepare``."""
    rng = np.random.default_rng(seed)
    t = np.linspace(t_end / (2 * t_obs), t_end, 2 * t_obs)
    phase = rng.uniform(0, 2 * np.pi, (n, 1, dim))
    rate = rng.uniform(0.05, 0.3, (n, 1, dim))
    x = np.exp(-rate * t[None, :, None]) * np.sin(2 * t[None, :, None] + phase)
    return SplitData.from_trajectories(t, x, t_obs)


def run(members: int, args, pack: bool) -> tuple[float, list[float]]:
    ends = [20.0 + 5.0 * i if args.systems else 20.0 for i in range(members)]
    trains = [split(100 + i, args.trajectories, args.points // 2, ends[i]) for i in range(members)]
    vals = [
        split(200 + i, args.trajectories // 8, args.points // 2, ends[i]) for i in range(members)
    ]
    models = []
    for i in range(members):
        with seeded(i):
            models.append(build_model("neural_laplace", 2))
    config = TrainConfig(epochs=args.epochs, patience=None, batch_size=128, lr=1e-3)
    t0 = time.perf_counter()
    results = train_packed(models, trains, vals, config, seeds=list(range(members)), pack=pack)
    seconds = time.perf_counter() - t0
    assert all(isinstance(r, TrainResult) for r in results), results
    assert all(r.packed_members == (members if pack else 1) for r in results)
    return seconds / (members * args.epochs), [r.history[-1].val_rmse for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--trajectories", type=int, default=640, help="training trajectories")
    parser.add_argument("--points", type=int, default=200, help="observed + predicted")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--systems", action="store_true", help="a different time grid per cell")
    parser.add_argument("--plain", action="store_true", help="also one by one, plain formulas")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"Neural Laplace, float64, CPU, {args.threads} thread(s), {args.members} cells of "
        f"{args.trajectories} × {args.points} × 2, {args.epochs} epochs, native kernels "
        f"{'on' if native_enabled() else 'off'}, {'per-cell' if args.systems else 'shared'} grids"
    )
    one, rmse_one = run(args.members, args, pack=False)
    packed, rmse_packed = run(args.members, args, pack=True)
    if args.plain:
        with plain_formulas():
            plain, _ = run(args.members, args, pack=False)
        print(f"one by one (plain formulas): {plain:.3f} s per cell-epoch")
    diff = max(abs(a - b) for a, b in zip(rmse_one, rmse_packed, strict=True))
    print(f"one by one (native): {one:.3f} s per cell-epoch")
    print(f"packed ×{args.members} (vmap):  {packed:.3f} s per cell-epoch")
    print(f"packed / one by one: {packed / one:.2f}  (max |Δ val RMSE| {diff:.1e})")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
