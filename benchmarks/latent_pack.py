"""Latent ODE: seeds packed into one model against the same cells trained one by one.

The Latent ODE (paper sizes, dopri5 rtol 1e-3 / atol 1e-4, ELBO) on the benchmark trajectories of
``nlmodels.diagnostics.trajectories`` (``--train`` training and ``--val`` validation
trajectories of 2 dimensions, ``--points`` observed and as many predicted points, batch 128,
float64, Adam with clipping at 1). In the same process, ``--repeats`` times alternating, it times

* one by one: ``nltrain.train`` of each of ``--members`` cells (seeds 0, 1, ...), the
  dopri5 of :mod:`nlmodels.baselines._dopri` with one lane;
* torchdiffeq: the same, with the latent solve by ``torchdiffeq.odeint`` (the solver the model
  used before the lane solver; the two take the same steps);
* packed: ``nltrain.train_packed`` of the ``--members`` cells as one batched model (one
  solver lane per member);

and prints seconds per cell-epoch (wall: median over epochs; CPU: the process's CPU time over the
whole run, set-up included, which a machine shared with other work disturbs less), the fastest
repeat, and the ratios. It checks that the packed members' validation RMSE equals the one-by-one
runs'.

    PYTHONPATH=. python benchmarks/latent_pack.py --threads 2 --members 5 --epochs 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasets import SplitData
from nlmodels import build_model
from nlmodels.baselines import LatentODE
from nlmodels.diagnostics import trajectories
from nltrain import seeded, train, train_packed
from tasks.config import TrainConfig


def splits(n_train: int, n_val: int, points: int) -> tuple[SplitData, SplitData]:
    t, x = trajectories(n_train + n_val, seed=0)
    stride = max(1, t.shape[0] // (2 * points))
    t, x = t[::stride][: 2 * points].numpy(), x[:, ::stride][:, : 2 * points].numpy()

    return (
        SplitData.from_trajectories(t, x[:n_train], points),
        SplitData.from_trajectories(t, x[n_train:], points),
    )


def models(seeds: range) -> list[LatentODE]:
    out = []
    for s in seeds:
        with seeded(s):
            out.append(build_model("latent_ode", 2))
    return out


def per_epoch(history) -> float:
    return statistics.median(r.seconds for r in history)


def one_by_one(tr, va, cfg, members: int, *, lanes: bool) -> tuple[float, list]:
    original = LatentODE._solves_in_lanes
    if not lanes:
        LatentODE._solves_in_lanes = lambda self: False  # torchdiffeq's odeint
    try:
        results = [
            train(m, tr, va, cfg, seed=s) for s, m in zip(range(members), models(range(members)))
        ]
    finally:
        LatentODE._solves_in_lanes = original
    return sum(per_epoch(r.history) for r in results) / members, results


def packed(tr, va, cfg, members: int) -> tuple[float, list]:
    results = train_packed(
        models(range(members)), [tr] * members, [va] * members, cfg, seeds=list(range(members))
    )
    assert all(r.packed_members == members for r in results), "the pack fell back to train()"
    return per_epoch(results[0].history) / members, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train", type=int, default=256, help="training trajectories per cell")
    ap.add_argument("--val", type=int, default=64)
    ap.add_argument("--points", type=int, default=50, help="observed (= predicted) points")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    if args.members < 2:
        ap.error("--members must be >= 2")
    torch.set_num_threads(args.threads)
    tr, va = splits(args.train, args.val, args.points)
    cfg = TrainConfig(epochs=args.epochs, patience=None, batch_size=128)
    print(
        f"Latent ODE, {args.threads} thread(s), {args.epochs} epochs, {args.train} train / "
        f"{args.val} val trajectories, {args.points} + {args.points} points, D = 2, batch 128, "
        f"float64, {args.members} members, torch {torch.__version__}\n"
    )
    runs = {
        "one by one": lambda: one_by_one(tr, va, cfg, args.members, lanes=True),
        "torchdiffeq": lambda: one_by_one(tr, va, cfg, args.members, lanes=False),
        f"packed ×{args.members}": lambda: packed(tr, va, cfg, args.members),
    }
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    cell_epochs = args.members * args.epochs
    for _ in range(args.repeats):  # alternating, so that a busy machine slows all alike
        results = {}
        for name, run in runs.items():
            c0 = time.process_time()
            seconds, results[name] = run()
            cpu_seconds = (time.process_time() - c0) / cell_epochs
            wall[name] = min(wall.get(name, seconds), seconds)
            cpu[name] = min(cpu.get(name, cpu_seconds), cpu_seconds)
        singles, packs = results["one by one"], results[f"packed ×{args.members}"]
        for a, b in zip(singles, packs):
            for ea, eb in zip(a.history, b.history):
                assert abs(ea.val_rmse - eb.val_rmse) < 1e-8, (ea, eb)
    print("| run | wall s/cell-epoch | vs one by one | CPU s/cell-epoch | vs one by one |")
    print("|---|---|---|---|---|")
    for name in runs:
        print(
            f"| {name} | {wall[name]:.3f} | {wall['one by one'] / wall[name]:.2f}× "
            f"| {cpu[name]:.3f} | {cpu['one by one'] / cpu[name]:.2f}× |"
        )


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
