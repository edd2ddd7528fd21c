"""Projected hours per column of the results ledger (the paper's Table 3 at full budget, and the
Laplace-domain peers' columns beside it) on this CPU, from a few measured paper-profile epochs
of each model.

``nllab ledger run`` trains a column one seed at a time: one benchmark of a method on the six
systems, whose cells the engine packs (:func:`tasks.engine.make_packs`, the CPU plan: cells of
equal shapes as one batched model, at most :data:`tasks.engine.CPU_PACK_MEMBERS` each; models
that prefer it train one by one). This script builds exactly those packs for seed 0 of each
method (paper profile: N = 1000, its data simulated or read from ``$NLLAB_HOME``), trains each
pack for ``--epochs`` epochs on one torch thread through the engine's own
:func:`nltrain.train_packed` (the step a ledger cell runs), and takes the median epoch after
the first. A column is 5 seeds × ``epochs`` (1000) epochs of the group of packs:

* **CPU hours**: the packs one after another on one thread (the work itself);
* **wall hours on C cores** (``--cores``, default this machine's): the packs of a group spread
  over the cores, one thread each, none slowing another (the group takes the longer of its
  longest pack and its total over C), groups one after another;

each beside its ratio to the node column measured in the same run. Not included: simulation,
Prefect, MLflow and evaluation time, other load on the machine (a nice 19 run beside other
work takes longer), early stopping (the paper profile has none).

    PYTHONPATH=. nice -n 10 python benchmarks/ledger_projection.py --epochs 3 [--record]

``--record`` writes the table to ``results/measurements/ledger_projection.json``
(:func:`tasks.reports.measurements.record_measurement`), which the docs' generator renders on the
ledger page (block ``measurement-ledger_projection``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from nltrain import LoopOptions, TrainResult, prefers_one_by_one, train_packed
from tasks.config import CellConfig
from tasks.engine import make_packs
from tasks.ledger import PEERS
from tasks.ledger.scope import paper_config
from tasks.pipeline import build_cell_model, prepare_cell, simulate_data

#: Table 3's columns, then the Laplace-domain and delay peers' (the ledger's other columns)
METHODS = ("node", "anode", "latent_ode", "nf_coupling", "nf_resnet", "neural_laplace", *PEERS)
SEEDS = 5


@dataclass(frozen=True)
class Pack:
    """One pack of a ledger group and its measured seconds per epoch (the whole pack's)."""

    systems: tuple[str, ...]
    packed: bool
    seconds: float


def train_pack(
    cells: Sequence[CellConfig], epochs: int, pack: bool | None = None
) -> tuple[list[torch.nn.Module], list[TrainResult], bool]:
    """``cells`` built and trained for ``epochs`` epochs through :func:`nltrain.train_packed`
    from their seeds' initial weights: (the trained models, their results, whether packed).
    ``pack``: None packs as the engine does (several cells of a model that packs on the CPU)."""
    models, trains, vals = [], [], []
    for c in cells:
        prepared = prepare_cell(c, simulate_data(c.system, c.data, c.seed))
        model, _ = build_cell_model(c, int(prepared.train.obs_x.shape[-1]))
        models.append(model)
        trains.append(prepared.train)
        vals.append(prepared.val)
    if pack is None:
        pack = len(cells) > 1 and not prefers_one_by_one(models[0], torch.device("cpu"))
    results = train_packed(
        models,
        trains,
        vals,
        cells[0].training.fixed_epochs(epochs),
        device="cpu",
        seeds=[c.seed for c in cells],
        options=LoopOptions(labels=tuple(c.key for c in cells)),
        pack=pack,
    )
    return models, results, pack


def median_epoch(result: TrainResult) -> float:
    """A training's median epoch seconds after the first (the first warms caches up)."""
    return statistics.median(r.seconds for r in result.history[1:] or result.history)


def time_pack(cells: Sequence[CellConfig], epochs: int) -> Pack:
    """Seconds per epoch of ``cells`` trained as the engine trains that pack."""
    _, results, packed = train_pack(cells, epochs)
    if packed:  # one history, shared by the members
        per_epoch = median_epoch(results[0])
    else:  # one after another: their epochs add up
        per_epoch = sum(median_epoch(res) for res in results)
    return Pack(tuple(c.system for c in cells), packed, per_epoch)


def measure(method: str, epochs: int) -> tuple[list[Pack], int]:
    """The packs of seed 0 of ``method`` on the six systems, timed; and the paper's epochs."""
    cells = paper_config(methods=[method], seeds=[0]).cells()
    packs = make_packs(cells, pack=True)
    return [time_pack(p, epochs) for p in packs], cells[0].training.epochs


def hours(packs: Sequence[Pack], epochs: int, cores: int) -> tuple[float, float]:
    """(CPU hours, wall hours on ``cores``) of a column: 5 seeds of this group of packs."""
    total = sum(p.seconds for p in packs)
    wall = max(max(p.seconds for p in packs), total / cores)
    return SEEDS * epochs * total / 3600, SEEDS * epochs * wall / 3600


COLUMNS = (
    "method",
    "packs of seed 0 (members: s/epoch)",
    "CPU h per column",
    "× node",
    "wall h on the cores",
    "× node",
)


def table_rows(rows: dict[str, tuple[list[Pack], float, float]]) -> list[tuple[str, ...]]:
    """One row per method: its packs, CPU and wall hours per column, each beside node's."""
    node = rows.get("node")
    out = []
    for method, (packs, cpu_h, wall_h) in rows.items():
        desc = "; ".join(
            f"{len(p.systems)}{' packed' if p.packed else ' one by one'}: {p.seconds:.2f}"
            for p in packs
        )
        ratio = (f"{cpu_h / node[1]:.2f}", f"{wall_h / node[2]:.2f}") if node else ("–", "–")
        out.append((method, desc, f"{cpu_h:.1f}", ratio[0], f"{wall_h:.1f}", ratio[1]))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3, help="epochs timed per pack (default 3)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="for the wall hours")
    ap.add_argument("--record", action="store_true", help="write results/measurements/")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = {}
    for method in args.methods:
        packs, paper_epochs = measure(method, args.epochs)
        rows[method] = (packs, *hours(packs, paper_epochs, args.cores))
        print(f"measured {method}: {time.perf_counter() - t0:.0f} s so far", file=sys.stderr)
    note = (
        f"{SEEDS} seeds × {paper_epochs} epochs per column, one torch thread per pack, "
        f"{args.epochs} epochs timed per pack (the median after the first); wall hours on "
        f"{args.cores} cores. Training only: no simulation, tracking or evaluation, and no "
        "other load (a nice 19 run beside other work takes longer)."
    )
    table = table_rows(rows)
    print(f"| {' | '.join(COLUMNS)} |\n|{'|'.join('---' for _ in COLUMNS)}|")
    for row in table:
        print(f"| {' | '.join(row)} |")
    print(f"\n{note}\n(measured in {time.perf_counter() - t0:.0f} s)")
    if args.record:
        from tasks.reports.measurements import record_measurement

        path = record_measurement(
            "ledger_projection",
            "projected hours per ledger column on this CPU",
            f"PYTHONPATH=. python benchmarks/ledger_projection.py --epochs {args.epochs} --record",
            COLUMNS,
            table,
            note,
        )
        print(f"recorded {path}")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
