"""How long each study of the paper takes at the paper's budget on this machine, before running it.

Every study body runs as ``nllab study NAME --profile paper`` would, with one difference: its
cells are planned, not trained (the body is handed "not trained" results), so this lists the
cells each table needs without training one. Each cell is then projected from the ledger's own
full-budget records on this processor (:mod:`tasks.ledger`; Table 3's and its ablation's, not a
study's, whose cells train other amounts): the median training seconds of its method on its
system at the paper profile (else of its method on any system), scaled by its
training trajectories and epochs against the paper profile's (N = 1000 × 80 %, 1000 epochs), and,
for a cell solved by another solver than Table 3's Euler (the solvers and NFE studies' dopri5),
by the ratio of that solver's epoch to Euler's in the committed wall-clock measurement of Table
11 (``results/measurements/wallclock.json``: the same model at the paper profile's settings). A
cell with the config hash of a Table 3 cell is Table 3's and costs nothing, except in a study
that measures the trained model (the CMI): there a Table 3 cell that the ledger already holds
trains again for its model (one not recorded yet is measured as Table 3 records it). A cell
with the config hash of a cell an earlier table of the ledger's order trains (the NFE figure's
dopri5 cells are the solvers table's) costs nothing either: ``ledger run`` measures it from the
run it makes for that table (its measured twin). The first
seed's hours are what the ledger trains of each table early (``ledger run`` gives each table of
:data:`flows.studies.LEDGER_STUDIES` its first seed after Table 3's first one, in that order).
A measurement study (its body times or loads trained models rather than training cells) lists
the cells it trains before it measures; what it measures beyond them is not projected.

A study that trains nothing (the wall clock of Table 11, timed by
``benchmarks/study_measurements.py``) has no cell to project.

    PYTHONPATH=. python benchmarks/study_projection.py [--record [--keep]] [--studies noise ...]

``--record`` writes ``results/measurements/study_projection.json`` (rendered by
``python -m flows.docs_numbers`` where a page holds the block); with ``--keep``, the record's
rows of the studies not projected now stay as they were projected (each row names the commit
it was projected at), so that a new table is projected without projecting the others again
(their projection was made before they were run: the ledger has grown since).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.ledger import solver_factors
from flows.studies import LEDGER_STUDIES, MEASURES, STUDIES, plan_study
from tasks.config import CellConfig
from tasks.ledger import DEFAULT_LEDGER, hardware_name, read_ledger
from tasks.ledger.scope import ledger_cell_configs
from tasks.reports.measurements import (
    Measurement,
    current_commit,
    read_measurement,
    record_measurement,
)

#: Training trajectories and epochs of a paper-profile cell (what the records' times are of).
PAPER_TRAIN, PAPER_EPOCHS = 800, 1000


def planned_cells(name: str) -> tuple[list[CellConfig], str]:
    """The cells study ``name`` trains at the paper profile, and how its body ended."""
    plan = plan_study(name, "paper")
    ended = "complete" if plan.stopped is None else "cells until it measures"
    return list(plan.cells), ended


def cell_seconds(
    cell: CellConfig,
    times: dict[tuple[str, str], list[float]],
    solver_factor: dict[tuple[str, str], float] | None = None,
) -> float | None:
    """The projected training seconds of ``cell`` from the records' ``times``, times its
    solver's ``solver_factor`` (keyed by method and solver; 1 for Euler, Table 3's)."""
    mine = times.get((cell.method, cell.system)) or [
        t for (m, _), ts in times.items() if m == cell.method for t in ts
    ]
    if not mine:
        return None
    n = cell.data.n_trajectories or 1000
    train = cell.data.n_train or int(n * cell.data.fractions[0])
    epochs = cell.training.epochs
    factor = (solver_factor or {}).get((cell.method, str(cell.model.get("solver", "euler"))), 1.0)
    return statistics.median(mine) * (train / PAPER_TRAIN) * (epochs / PAPER_EPOCHS) * factor


def split_cells(
    cells: list[CellConfig], table3: set[str], held: set[str], earlier: set[str]
) -> tuple[list[CellConfig], list[CellConfig]]:
    """A table's cells that are another table's (``table3``'s configs, or those the
    ``earlier`` tables of the ledger's order train), and those it trains: the rest, and the
    Table 3 configs whose records lack what this table measures of the model (``held``)."""
    shared = [c for c in cells if c.config_hash() in table3 | earlier]
    free = (table3 - held) | earlier
    return shared, [c for c in cells if c.config_hash() not in free]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", nargs="+", default=list(STUDIES), metavar="NAME")
    ap.add_argument("--record", action="store_true", help="write the measurement record")
    ap.add_argument(
        "--keep", action="store_true", help="with --record: keep the other studies' rows"
    )
    args = ap.parse_args()
    here = hardware_name("cpu")
    # CPU records (the earliest name no device), this processor's first
    # (not a study's record: its cell trains another amount, 200 epochs on N = 30, say)
    records = [
        r
        for r in read_ledger(DEFAULT_LEDGER)
        if r.timed_seconds and r.device != "cuda" and not r.study
    ]
    ordered = [r for r in records if r.hardware == here] + [
        r for r in records if r.hardware != here
    ]
    times: dict[tuple[str, str], list[float]] = {}
    for r in ordered:
        key = (r.method, r.system)
        if key not in times or r.hardware == here:
            times.setdefault(key, []).append(float(r.timed_seconds or 0))
    table3 = {c.config_hash() for c, _ in ledger_cell_configs()}
    factors = solver_factors()
    ledger = [r for r in read_ledger(DEFAULT_LEDGER) if r.numerics]
    commit = current_commit().split(" ")[0]
    order = [s for s in LEDGER_STUDIES if s in args.studies]
    order += [s for s in args.studies if s not in LEDGER_STUDIES]
    rows = []
    earlier: set[str] = set()  # what the tables before this one in the ledger's order train
    for name in LEDGER_STUDIES if set(order) <= set(LEDGER_STUDIES) else order:
        cells, ended = planned_cells(name)
        # a measuring study's Table 3 cells that the ledger holds unmeasured train again
        measure = MEASURES.get(name)
        held = {r.config_hash for r in ledger} if measure else set()
        held -= {r.config_hash for r in ledger if r.measured.has(measure or "")}
        shared, new = split_cells(cells, table3, held, earlier)
        earlier |= {c.config_hash() for c in new}
        if name not in order:  # (planned only for what it trains before the next)
            continue
        seconds = [cell_seconds(c, times, factors) for c in new]
        first = min((c.seed for c in cells), default=0)
        first_seconds = [s for c, s in zip(new, seconds, strict=True) if c.seed == first]
        hours = sum(s for s in seconds if s is not None) / 3600
        unknown = sum(s is None for s in seconds)
        rows.append(
            (
                name,
                str(len(cells)),
                str(len(shared)),
                f"{hours:.1f}" + (f" (+{unknown} cells without a record)" if unknown else ""),
                f"{sum(s for s in first_seconds if s is not None) / 3600:.1f}",
                f"{hours / 2:.1f}",
                _order(name) + ("" if ended == "complete" else f"; {ended}"),
                commit,
            )
        )
        print(" | ".join(rows[-1]), flush=True)
    if args.record:
        if args.keep and PATH.is_file():
            rows = _merged(read_measurement(PATH), rows)
        path = record_measurement(
            "study_projection",
            "CPU hours each study of the paper needs at its budget here, from the ledger's records",
            "PYTHONPATH=. python benchmarks/study_projection.py --record",
            COLUMNS,
            rows,
            note=f"Projected from the ledger's full-budget records on {here} (median training "
            "seconds of the method on the system, scaled by training trajectories and epochs, and "
            "an adaptive solver's cells by its epoch's ratio to Euler's in the wall-clock "
            "measurement); "
            "one cell a core. Rows in the order ledger run gives each table its first seed; "
            "each projected at the commit it names (`--keep`: a study's row is not projected "
            "again once its table is run).",
        )
        print(f"recorded {path}")


COLUMNS = (
    "study",
    "cells",
    "of them Table 3's or an earlier table's",
    "CPU hours",
    "first seed, CPU hours",
    "wall hours on 2 cores",
    "order",
    "projected at",
)
#: A kept record's columns under their earlier names (the cells another table trains were
#: Table 3's alone before the NFE figure's were known to be the solvers table's: for every
#: other table the two counts are equal).
RENAMED = {"of them Table 3's": "of them Table 3's or an earlier table's"}
PATH = Path(__file__).resolve().parents[1] / "results" / "measurements" / "study_projection.json"


def _order(name: str) -> str:
    """Where the ledger keeps study ``name``: its place in ``ledger run``'s order of tables."""
    if name in LEDGER_STUDIES:
        return f"ledger, {LEDGER_STUDIES.index(name) + 1} of {len(LEDGER_STUDIES)}"
    return "ledger: Table 3's ablation" if name == "stereographic" else "not in the ledger"


def _merged(kept: Measurement, rows: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """``rows`` with the rows of ``kept`` (an earlier record) of the studies they lack, as they
    were projected (a row without its commit names the record's), only their place in the order
    told again; in the order of the studies (:data:`LEDGER_STUDIES` first)."""
    new = {r[0]: r for r in rows}
    out = dict(new)
    for old in kept.rows:
        row = {RENAMED.get(c, c): v for c, v in zip(kept.columns, old, strict=True)}
        if row["study"] in new:
            continue
        ended = row["order"].partition("; ")[2]
        row["order"] = _order(row["study"]) + (f"; {ended}" if ended else "")
        row.setdefault("projected at", kept.commit.split(" ")[0])
        out[row["study"]] = tuple(row[c] for c in COLUMNS)
    rank = {name: i for i, name in enumerate(dict.fromkeys([*LEDGER_STUDIES, *STUDIES]))}
    return sorted(out.values(), key=lambda r: rank.get(r[0], len(rank)))


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
