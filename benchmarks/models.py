"""Benchmark the six forecasting models: sizes, training speed and NFEs against Neural Laplace.

Prints (1) parameter counts for D = 1 and D = 2 against the paper's Table 7, (2) seconds per
training epoch on 800 smooth two-dimensional trajectories (100 observed + 100 predicted points,
batch 128, float64, CPU, the paper's protocol: Adam lr 1e−3, gradient-norm clipping at 1; the
training loop a cell runs, ``nltrain.epoch_seconds``, one validation batch included),
and (3) the function evaluations needed to extrapolate one point Δt ahead of the last
observation for Δt ∈ {1, 10, 100} (ODE models with dopri5), with Neural Laplace as the unit.

    python benchmarks/models.py [--epochs 1] [--threads 1] [--models node,anode,...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nlmodels.baselines
from datasets import SplitData
from nlmodels.diagnostics import horizon_nfe, trajectories
from nlmodels.model_registry import MODELS, build_model
from nltrain import epoch_seconds
from tasks.config import TrainConfig

try:  # the unit of every ratio; the benchmark still runs while it is being written
    import nlmodels.neural_laplace  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the checkout
    print(f"note: neural_laplace not importable ({exc}); ratios are omitted", file=sys.stderr)

TABLE7 = {"neural_laplace": 17194, "node": 17025, "anode": 17282, "latent_ode": 18565,
          "nf_coupling": 18307, "nf_resnet": 18307}  # fmt: skip
ORDER = list(TABLE7)
HORIZONS = (1.0, 10.0, 100.0)


def ratio(value: float | None, unit: float | None) -> str:
    return "-" if value is None or not unit else f"{value / unit:.2f}x"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per model")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--models", default=",".join(ORDER), help="comma-separated names")
    parser.add_argument("--trajectories", type=int, default=800)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in TABLE7]
    if unknown:
        parser.error(f"unknown models {unknown}; valid models: {', '.join(ORDER)}")
    names = [n for n in names if n in MODELS]  # neural_laplace may be missing
    torch.set_num_threads(args.threads)
    t, x = trajectories(args.trajectories)
    # the training loop a cell runs, validated on one batch of the same trajectories
    train_split = SplitData.from_trajectories(t.numpy(), x.numpy(), 100)
    val_split = SplitData.from_trajectories(t.numpy(), x[: args.batch].numpy(), 100)
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch)

    rows = {}
    for name in names:
        torch.manual_seed(0)
        p1 = sum(p.numel() for p in build_model(name, 1).parameters())
        torch.manual_seed(0)
        model = build_model(name, 2).double()
        p2 = sum(p.numel() for p in model.parameters())
        secs, nfe_batch = epoch_seconds(model, train_split, val_split, config)
        if name in ("node", "anode"):  # the NFE comparison uses the adaptive solver
            model.solver = "dopri5"
        nfes = [horizon_nfe(model, t, x, dt) for dt in HORIZONS]
        rows[name] = (p1, p2, secs, nfe_batch, nfes)
        print(f"  done {name}: {secs:.2f} s/epoch", file=sys.stderr, flush=True)

    unit = rows.get("neural_laplace")
    print(f"\nfloat64, CPU, {args.threads} thread(s), {args.trajectories} trajectories, "
          f"batch {args.batch}, {args.epochs} epoch(s)")  # fmt: skip
    print("NODE/ANODE NFE dt with dopri5 (rtol 1e-3, atol 1e-4), as the Latent ODE")
    head = (f"{'model':<15}{'params D=1':>11}{'Table 7':>9}{'diff':>8}{'params D=2':>11}"
            f"{'s/epoch':>9}{'xNL':>8}{'NFE/batch':>10}"
            + "".join(f"{f'NFE dt={dt:g}':>12}{'xNL':>9}" for dt in HORIZONS))  # fmt: skip
    print(head)
    print("-" * len(head))
    for name, (p1, p2, secs, nfe_batch, nfes) in rows.items():
        diff = 100 * (p1 / TABLE7[name] - 1)
        line = (f"{name:<15}{p1:>11,}{TABLE7[name]:>9,}{diff:>7.1f}%{p2:>11,}{secs:>9.2f}"
                f"{ratio(secs, unit and unit[2]):>8}{nfe_batch:>10.1f}")  # fmt: skip
        for i, n in enumerate(nfes):
            line += f"{n:>12}{ratio(n, unit and unit[4][i]):>9}"
        print(line)
    print("\nNFE/batch: evaluations of the vector field / flow / g per training batch, encoder")
    print("included (direct backpropagation through the solver adds none). NFE dt: decoder only;")
    print("the Latent ODE integrates from the first observed time (its z0), NODE/ANODE from the")
    print("last observation. Briefly trained fields are smooth: their NFEs grow with training.")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
