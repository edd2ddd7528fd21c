"""Side-by-side trainings and torch's thread count: what the cores' oversubscription costs.

Two ``nllab ledger run`` jobs side by side on one machine (the standing background set-up: one
job per seed range) each take the machine's cores for their worker when the profile leaves
``torch_threads`` unset (the paper profile: "the cores shared among the workers" of that one
job), so two jobs on two cores run four torch threads. A cell's result does not depend on the
thread count (:class:`tasks.config.ExecutionConfig`: execution settings never enter a config
hash), only its speed does.

This script starts ``--processes`` trainings at the same moment (default: one per core), each a
paper-profile cell of ``--method`` on ``--system`` for ``--epochs`` epochs, first with one torch
thread each, then with ``--threads`` (default: the machine's cores, what an unset
``torch_threads`` gives a one-worker job), ``--repeats`` times alternating, and prints the
median seconds per epoch of each setting (the median over processes and repeats, the first
epoch of each training left out) and their ratio. It also checks that every training of a
setting ends with the same weights, and that the two settings' weights are equal.

    PYTHONPATH=. python benchmarks/oversubscription.py [--method latent_ode] [--record]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _child(method: str, system: str, epochs: int, threads: int) -> None:
    """One training: prints ``{"epochs": [seconds...], "weights": sha256}`` as JSON."""
    from nlmodels import set_up_numerics

    set_up_numerics()
    import torch

    torch.set_num_threads(threads)
    from nltrain import train
    from tasks.ledger import paper_config
    from tasks.pipeline import build_cell_model, prepare_cell, simulate_data

    cell = paper_config(systems=[system], methods=[method], seeds=[0]).cells()[0]
    config = cell.training.model_copy(update={"epochs": epochs, "patience": None})
    ds = simulate_data(system, cell.data, cell.seed)
    prepared = prepare_cell(cell, ds)
    model, _ = build_cell_model(cell, ds.x.shape[-1])
    ends: list[float] = []
    start = time.perf_counter()
    train(
        model,
        prepared.train,
        prepared.val,
        config,
        seed=cell.seed,
        on_epoch=lambda *_: ends.append(time.perf_counter()),
    )
    times = [b - a for a, b in zip([start, *ends[:-1]], ends)]
    digest = hashlib.sha256(
        b"".join(v.detach().cpu().numpy().tobytes() for v in model.state_dict().values())
    ).hexdigest()
    print(json.dumps({"epochs": times, "weights": digest}))


def _side_by_side(args: argparse.Namespace, threads: int) -> list[dict]:
    """``--processes`` trainings started at once, each with ``threads`` torch threads."""
    command = [
        sys.executable,
        __file__,
        "--child",
        "--method",
        args.method,
        "--system",
        args.system,
        "--epochs",
        str(args.epochs),
        "--threads",
        str(threads),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(args.processes)
    ]
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a training failed (exit {p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    from tasks.config import SYSTEM_NAMES
    from tasks.machine import usable_cores

    cores = usable_cores()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", default="latent_ode", help="a registered model")
    parser.add_argument("--system", default="spiral_dde", choices=SYSTEM_NAMES)
    parser.add_argument("--epochs", type=int, default=6, help="epochs per training")
    parser.add_argument("--processes", type=int, default=cores, help="trainings side by side")
    parser.add_argument(
        "--threads", type=int, default=cores, help="torch threads per training to compare with 1"
    )
    parser.add_argument("--repeats", type=int, default=2, help="rounds of both settings")
    parser.add_argument("--record", action="store_true", help="write results/measurements/")
    parser.add_argument("--note", default="", help="said after the record's note (the load)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.method, args.system, args.epochs, args.threads)
        return
    if min(args.epochs, args.processes, args.threads, args.repeats) < 1 or args.epochs < 2:
        parser.error("--epochs must be at least 2, the other counts at least 1")
    settings = (1, args.threads)
    seconds: dict[int, list[float]] = {t: [] for t in settings}
    weights: dict[int, set[str]] = {t: set() for t in settings}
    for _ in range(args.repeats):
        for threads in settings:
            for run in _side_by_side(args, threads):
                seconds[threads].extend(run["epochs"][1:])
                weights[threads].add(run["weights"])
            print(f"{threads} thread(s) each: {statistics.median(seconds[threads]):.3f} s/epoch")
    from tasks.reports import plural
    from tasks.reports.measurements import show_measurement

    one = statistics.median(seconds[1])
    same = len(weights[1]) == 1 and weights[1] == weights[args.threads]
    columns = ("torch threads per training", "s/epoch", "against one thread", "same weights")
    rows = [
        (
            str(t),
            f"{statistics.median(seconds[t]):.3f}",
            f"x{statistics.median(seconds[t]) / one:.2f}",
            "yes" if same else "NO",
        )
        for t in settings
    ]
    note = (
        f"{args.processes} paper-profile {args.method} cells on {args.system} (seed 0) "
        f"trained side by side on {plural(cores, 'core')}, "
        f"{plural(args.epochs, 'epoch')} each, the settings alternating over "
        f"{plural(args.repeats, 'round')}; seconds per epoch the median over trainings and "
        "epochs after the first. Same weights: every training's final weights equal, under "
        "both settings." + (f" {args.note}" if args.note else "")
    )
    command = (
        f"PYTHONPATH=. python benchmarks/oversubscription.py --method {args.method} "
        f"--epochs {args.epochs} --repeats {args.repeats} --record"
    )
    title = "trainings side by side: one torch thread each against the cores each"
    show_measurement(
        columns, rows, note, record=("oversubscription", title, command) if args.record else None
    )


if __name__ == "__main__":
    main()
