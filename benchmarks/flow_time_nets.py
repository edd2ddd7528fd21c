"""The Neural Flows' time functions, tanh against linear, on the paper profile's own cells.

Tanh is Biloš et al.'s bounded φ; linear is the paper's reference code's (stribor's
``TimeLinear``). Each (system, model) is trained from the same initial weights with either
time function (``time_net``; everything else the paper profile's cell: its data, split,
normalisation and protocol, seed 0), for a fixed number of epochs, and scored on its test split
(the best validation epoch's weights, as the ledger scores). The runs of one model train as one
pack (bitwise their unpacked runs, ``tests/test_pack_bitwise.py``), the two models in two
processes. A short budget says which way the choice goes, not the full-budget figure (the
ledger's).

    PYTHONPATH=. python benchmarks/flow_time_nets.py [--epochs 40] [--systems ...] [--record]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.config import MAIN_SYSTEMS

TIME_NETS = ("tanh", "linear")
METHODS = ("nf_coupling", "nf_resnet")


def scores(method: str, systems: tuple[str, ...], epochs: int, seed: int) -> list[float]:
    """Test RMSE of ``method`` on each system × time function (in that order), one pack."""
    import torch

    from nlmodels import set_up_numerics
    from nltrain import evaluate, train_packed
    from tasks.config import resolve_config
    from tasks.pipeline import build_cell_model, prepare_cell, simulate_data

    set_up_numerics()
    torch.set_num_threads(1)
    paper = {(c.system, c.method, c.seed): c for c in resolve_config("paper").cells()}
    cells, models, splits = [], [], []
    for system in systems:
        base = paper[(system, method, seed)]
        prepared = prepare_cell(base, simulate_data(system, base.data, seed))
        for time_net in TIME_NETS:
            cell = base.model_copy(update={"model": {**base.model, "time_net": time_net}})
            models.append(build_cell_model(cell, prepared.train.obs_x.shape[-1])[0])
            cells.append(cell)
            splits.append(prepared)
    config = cells[0].training.fixed_epochs(epochs)
    train_packed(
        models,
        [p.train for p in splits],
        [p.val for p in splits],
        config,
        seeds=[seed] * len(models),
    )
    return [
        evaluate(m, p.test, p.normaliser)[0].test_rmse for m, p in zip(models, splits, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=40, help="epochs per run (fixed)")
    parser.add_argument("--systems", nargs="+", default=list(MAIN_SYSTEMS), help="paper systems")
    parser.add_argument("--seed", type=int, default=0, help="the paper profile's seed")
    parser.add_argument("--record", action="store_true", help="write results/measurements/")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    unknown = sorted(set(args.systems) - set(MAIN_SYSTEMS))
    if unknown:
        parser.error(f"not a system of the paper's table: {', '.join(unknown)}")
    if not 0 <= args.seed <= 4:
        parser.error(f"--seed must be one of the paper profile's seeds 0-4, got {args.seed}")
    systems = tuple(args.systems)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(METHODS), mp_context=spawn) as pool:
        futures = [pool.submit(scores, m, systems, args.epochs, args.seed) for m in METHODS]
        results = dict(zip(METHODS, (f.result() for f in futures), strict=True))
    columns = ("model", "system", "tanh", "linear", "linear / tanh")
    rows = []
    for method, rmse in results.items():
        for i, system in enumerate(systems):
            tanh, linear = rmse[2 * i], rmse[2 * i + 1]
            rows.append((method, system, f"{tanh:.4f}", f"{linear:.4f}", f"{linear / tanh:.2f}"))
    for row in rows:
        print("  ".join(f"{c}: {v}" for c, v in zip(columns, row, strict=True)))
    note = (
        f"Test RMSE (normalised, extrapolated half) after {args.epochs} epochs of the paper "
        f"profile's cell (seed {args.seed}), best validation weights; the same initial weights "
        f"for both time functions."
    )
    print(note)
    if args.record:
        from tasks.reports.measurements import record_measurement

        path = record_measurement(
            "flow_time_nets",
            "the Neural Flows' time functions, tanh against the reference's linear",
            f"PYTHONPATH=. python benchmarks/flow_time_nets.py --epochs {args.epochs} --record",
            columns,
            rows,
            note,
        )
        print(f"recorded {path}")


if __name__ == "__main__":
    main()
