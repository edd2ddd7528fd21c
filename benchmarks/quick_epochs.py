"""Quick-profile epochs for a model by the profile's rule (equal training time), measured here.

``tasks/profiles/quick.yaml`` sizes each model's epochs as those it trains in 25 s on its
reference machine (2 cores, one thread per cell, nothing else running). A machine that is not
quiet cannot repeat that measurement, but the *ratio* of two models' epoch times is kept when
they are timed alike, in turns: this script builds every asked model's quick cell on each main
system (the cell's own data, split and initial weights), trains them one epoch each in turn,
``--rounds`` times (a change of load falls on every model alike), and takes each model's median
seconds per epoch per system. A model's count on a system is then, for each anchor (a model the
profile sizes: Neural Laplace and NODE by default), the anchor's quick epochs × its epoch time
÷ the model's, averaged over the anchors; its quick epochs are the middle of its range over the
systems, rounded to 5 (the profile's rule).

    python benchmarks/quick_epochs.py --models laplace_net lno neural_dde [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nltrain import train
from tasks.config import MAIN_SYSTEMS, QUICK_EPOCHS, resolve_config
from tasks.pipeline import build_cell_model, prepare_cell, simulate_data


def epoch_times(
    methods: list[str], systems: list[str], rounds: int
) -> dict[tuple[str, str], float]:
    """(method, system) → the median seconds of one training epoch of its quick cell, the
    methods of a system timed in turns."""
    config = resolve_config("quick", overrides={"methods": methods, "systems": systems})
    out = {}
    for system in systems:
        cells = [c for c in config.cells() if c.system == system]
        setups = []
        for cell in cells:
            ds = simulate_data(cell.system, cell.data, cell.seed)
            prepared = prepare_cell(cell, ds)
            model, _ = build_cell_model(cell, int(ds.x.shape[-1]))
            setups.append((cell, model, prepared))
        times: dict[str, list[float]] = {c.method: [] for c in cells}
        for _ in range(rounds + 1):  # the first round warms up, untimed
            for cell, model, prepared in setups:
                one = cell.training.model_copy(update={"epochs": 1}).fixed_epochs()
                t0 = time.perf_counter()
                train(model, prepared.train, prepared.val, one)
                times[cell.method].append(time.perf_counter() - t0)
        for method, ts in times.items():
            out[(method, system)] = statistics.median(ts[1:])
            print(f"  {system:<22}{method:<16}{out[(method, system)]:.3f} s/epoch", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--anchors", nargs="+", default=["neural_laplace", "node"])
    ap.add_argument("--systems", nargs="+", default=list(MAIN_SYSTEMS))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the profile's one thread per cell
    times = epoch_times([*args.anchors, *args.models], args.systems, args.rounds)
    for method in args.models:
        counts = [
            statistics.fmean(
                QUICK_EPOCHS[a] * times[(a, s)] / times[(method, s)] for a in args.anchors
            )
            for s in args.systems
        ]
        middle = 5 * round((min(counts) + max(counts)) / 2 / 5)
        shown = ", ".join(f"{c:.0f}" for c in counts)
        print(f"{method}: {shown} epochs per system -> quick epochs {max(middle, 5)}")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()
    main()
