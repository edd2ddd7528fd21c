"""The copy floor: the lowest test RMSE the reference code's NODE and ANODE can reach.

The reference (samholt/NeuralLaplace, ``original_ode_models.py``) integrates from the last
observation over the query times alone, so its prediction at the first query time *is* the last
observation. Even a model perfect at every other query time keeps that error: over the test
split (normalised, as scored), the floor is ``sqrt(Σ (x_last − x(t_q0))² / (N·T_q·D))``. It needs
no training, only the paper profile's data sets, seed by seed.

    PYTHONPATH=. python benchmarks/copy_floor.py [--record]

``--record`` writes ``results/measurements/copy_floor.json`` (the fidelity page renders it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.cell import prepare_cell, simulate_data
from tasks.config import MAIN_SYSTEMS
from tasks.ledger.scope import paper_config
from tasks.reports.measurements import record_measurement


def copy_floor(split) -> float:
    """The floor of one split: the last observation's error at the first query time, spread
    over every predicted value."""
    gap = np.asarray(split.obs_x)[:, -1, :] - np.asarray(split.target)[:, 0, :]
    return float(np.sqrt(np.sum(gap**2) / np.asarray(split.target).size))


def floors(system: str, seeds: list[int]) -> list[float]:
    cells = paper_config(systems=[system], methods=["node"], seeds=seeds).cells()
    return [
        copy_floor(prepare_cell(c, simulate_data(c.system, c.data, c.seed)).test) for c in cells
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="write the measurement record")
    args = ap.parse_args()
    seeds = [0, 1, 2, 3, 4]
    rows = []
    for system in MAIN_SYSTEMS:
        values = floors(system, seeds)
        mean, std = statistics.fmean(values), statistics.stdev(values)
        rows.append((system, f"{values[0]:.4g}", f"{mean:.4g} ± {std:.2g}"))
        print(f"{system:24s} seed 0 {values[0]:.4g}   seeds 0-4 {mean:.4g} ± {std:.2g}")
    if args.record:
        path = record_measurement(
            "copy_floor",
            "the copy floor of the reference's NODE/ANODE (test RMSE, normalised)",
            "PYTHONPATH=. python benchmarks/copy_floor.py --record",
            ("system", "seed 0", "seeds 0-4 (mean ± sample std)"),
            rows,
            note="No model of the reference's protocol scores below its seed's floor: its first "
            "prediction is the last observation.",
        )
        print(f"recorded {path}")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the data paths require
    main()
