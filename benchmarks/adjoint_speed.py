"""The reference protocol's NODE and ANODE on the CPU: a training epoch through torchdiffeq's
``odeint_adjoint`` (the semi-norm) against the same epoch through its eager twin, in one
process, and whether the two trained the same bytes: with Euler, as Table 3 trains them
(:func:`nlmodels.baselines._euler.euler_adjoint_eager`), or with dopri5 at the reference's
tolerances, as the adaptive-solver table (Table 10) and the NFE figure train them
(``--solver dopri5``: :func:`nlmodels.baselines._dopri_adjoint.dopri5_adjoint_eager`).

Each model as the paper profile builds it, on one system's data as a Table 3 cell splits it
(the paper profile's trajectories, batch and step size), one torch thread: ``--epochs`` epochs
each way, ``--repeats`` times in alternation (the first pair also warms up), seconds per epoch
the median over repeats. "Same bytes": every epoch's losses, validation RMSE and evaluations
counted, and the weights after the last, compared exactly.

    PYTHONPATH=. python benchmarks/adjoint_speed.py [--system spiral_dde] [--epochs 3] [--record]
    PYTHONPATH=. python benchmarks/adjoint_speed.py --solver dopri5 --epochs 1 --repeats 2 --record

``--record`` writes ``results/measurements/adjoint_speed.json`` (Euler) or
``adjoint_speed_dopri5.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SOLVES = ("odeint_adjoint", "eager twin")
#: The models the paper profile trains through the Euler adjoint.
ADJOINT_MODELS = ("node", "anode")


#: solver -> the name of its eager twin in :mod:`nlmodels.baselines._solve`
TWINS = {"euler": "euler_adjoint_eager", "dopri5": "dopri5_adjoint_eager"}


def _through_torchdiffeq(solver: str):
    """The solve as torchdiffeq runs it (what the recorded cells ran), in the twin's place."""
    from torchdiffeq import odeint_adjoint

    def solve(field, x0, times, owner, count=None, **tolerances):
        params = () if owner is None else tuple(owner.parameters())
        return odeint_adjoint(
            field, x0, times, method=solver, adjoint_params=params,
            adjoint_options={"norm": "seminorm"}, **tolerances,
        )  # fmt: skip

    return solve


def _train(
    method: str, system: str, epochs: int, solve: str, solver: str
) -> tuple[float, tuple, dict]:
    """Seconds per epoch, the history and the weights of one cell's training through
    ``solve``."""
    from nlmodels.baselines import REFERENCE_TOLERANCES, _solve
    from nltrain import train
    from tasks.ledger import paper_config
    from tasks.pipeline import build_cell_model, prepare_cell, simulate_data

    cell = paper_config(systems=[system], methods=[method], seeds=[0]).cells()[0]
    if solver != "euler":  # as the solvers study sets an adaptive solver at the paper's budget
        settings = {"solver": solver, **REFERENCE_TOLERANCES}
        cell = cell.model_copy(update={"model": {**cell.model, **settings}})
    config = cell.training.model_copy(update={"epochs": epochs, "patience": None})
    ds = simulate_data(system, cell.data, cell.seed)
    prepared = prepare_cell(cell, ds)
    model, _ = build_cell_model(cell, ds.x.shape[-1])
    twin = getattr(_solve, TWINS[solver])
    if solve == "odeint_adjoint":
        setattr(_solve, TWINS[solver], _through_torchdiffeq(solver))
    try:
        start = time.perf_counter()
        result = train(model, prepared.train, prepared.val, config, seed=cell.seed)
        seconds = (time.perf_counter() - start) / epochs
    finally:
        setattr(_solve, TWINS[solver], twin)
    history = tuple((r.train_loss, r.val_loss, r.val_rmse, r.nfe) for r in result.history)
    return seconds, history, {k: v.clone() for k, v in model.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    from tasks.config import SYSTEM_NAMES

    parser.add_argument(
        "--system", default="spiral_dde", choices=SYSTEM_NAMES, help="whose data and grid"
    )
    parser.add_argument(
        "--methods", nargs="+", default=list(ADJOINT_MODELS), choices=ADJOINT_MODELS
    )
    parser.add_argument(
        "--solver",
        default="euler",
        choices=tuple(TWINS),
        help="the models' solver (default: euler)",
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs per timed training")
    parser.add_argument("--repeats", type=int, default=3, help="timed trainings each way")
    parser.add_argument("--record", action="store_true", help="write results/measurements/")
    args = parser.parse_args()
    if args.epochs < 1 or args.repeats < 1:
        parser.error("--epochs and --repeats must be at least 1")
    torch.set_num_threads(1)
    rows = []
    for method in args.methods:
        times: dict[str, list[float]] = {s: [] for s in SOLVES}
        runs = {}
        for _ in range(args.repeats):
            for solve in SOLVES:
                seconds, history, weights = _train(
                    method, args.system, args.epochs, solve, args.solver
                )
                times[solve].append(seconds)
                runs[solve] = (history, weights)
        (h_a, w_a), (h_b, w_b) = runs[SOLVES[0]], runs[SOLVES[1]]
        same = (
            h_a == h_b
            and w_a.keys() == w_b.keys()
            and all(torch.equal(w_a[k], w_b[k]) for k in w_a)
        )
        old, new = (statistics.median(times[s]) for s in SOLVES)
        rows.append(
            (method, f"{old:.2f}", f"{new:.2f}", f"×{old / new:.2f}", "yes" if same else "NO")
        )
        print(f"{method}: {old:.2f} s/epoch through odeint_adjoint, {new:.2f} through the eager "
              f"twin (×{old / new:.2f}); the same bytes: {same}")  # fmt: skip
    from tasks.reports import plural

    columns = ("model (paper profile)", *(f"{s} s/epoch" for s in SOLVES), "speed-up", "same bytes")
    note = (
        f"{args.system}'s data as its Table 3 cell splits it, seed 0, one torch thread; "
        f"{plural(args.epochs, 'epoch')} each way, the median of {args.repeats} alternated "
        "trainings. "
        "Same bytes: each epoch's losses, validation RMSE and evaluations counted, and the "
        "final weights, equal."
    )
    if args.record:
        from tasks.reports.measurements import record_measurement

        name = "adjoint_speed" if args.solver == "euler" else f"adjoint_speed_{args.solver}"
        command = "PYTHONPATH=. python benchmarks/adjoint_speed.py --record"
        title = "the reference NODE/ANODE's training epoch through each Euler adjoint"
        if args.solver != "euler":
            command = (
                f"PYTHONPATH=. python benchmarks/adjoint_speed.py --solver {args.solver} "
                f"--system {args.system} --epochs {args.epochs} --repeats {args.repeats} --record"
            )
            title = (
                f"the reference NODE/ANODE's training epoch through each {args.solver} adjoint "
                "(the reference's tolerances)"
            )
        print(f"recorded {record_measurement(name, title, command, columns, rows, note)}")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
