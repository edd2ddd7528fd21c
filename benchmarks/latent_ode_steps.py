"""How many dopri5 iterations the Latent ODE's latent solve takes, per system, under the paper
profile: the figure a fixed iteration budget (a solve captured into a CUDA graph) is chosen from.

For each system of the paper's table, the paper profile's Latent ODE cell (seed 0: its data, its
options, its batch size) is trained ``--epochs`` epochs on the CPU, and every latent solve is
counted: the iterations the lane-batched dopri5 needs (accepted plus rejected steps of the
slowest lane), in training steps and in validation. Prints one row per system (and writes the
record ``results/measurements/latent_ode_steps.json`` with ``--record``): the largest count of
the first epoch, of the whole run and of its last epoch, and the median of the last epoch.

``--project DIR`` (a GPU node's ``make gpu-check`` folder, which timed the Latent ODE's packs
with eager steps only) projects its captured packs instead, from those counts, and records the
full paper profile's projection (``results/measurements/gpu_projection.json``) with that row
marked projected. A replayed graph runs the kernels of the eager step without launching them one
by one, so its time is the eager pack's time, scaled by the kernels the step runs (counted here,
on the CPU twin, as the operators one packed step dispatches: those outside the latent solve,
plus those of one solver iteration times the iterations), over the gain graphs gave the other
models on that machine (the smallest, ×5 over eager ×5 and ×30 over ×5). The eager step runs the
iterations its solves need, rounded up to the host's end test every 4; the captured one runs its
budget: twice the most the paper's solves needed here (at least 16).

A folder whose table timed NODE and ANODE at their defaults (Euler, back-propagation through the
solve) rather than as the paper profile trains them (the adjoint; ``throughput.py
--paper-settings``) has their rows projected too (:func:`project_adjoint`): CUDA timings scaled
by the kernels of a packed epoch with the adjoint over one without (counted on the CPU twin,
:mod:`benchmarks.step_kernels`), CPU timings by the CPU time of the two eager epochs measured
here.

    PYTHONPATH=. python benchmarks/latent_ode_steps.py --epochs 30 --record
    NLLAB_CPU_NUMERICS=native PYTHONPATH=. python benchmarks/latent_ode_steps.py --record \
        --project results/gpu/2026-11-27-h200-third
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.config import MAIN_SYSTEMS

COLUMNS = (
    "system",
    "epochs",
    "max, epoch 1",
    "max, all epochs",
    "max, last epoch",
    "median, last epoch",
    "s/epoch",
)


def count_steps(system: str, epochs: int, seed: int = 0) -> list[list[int]]:
    """Per epoch, the iterations of every latent solve of the paper cell of ``system``."""
    import torch

    import nlmodels.baselines.latent_ode as latent_ode
    from nltrain import train
    from tasks.config import resolve_config
    from tasks.pipeline import build_cell_model, prepare_cell, simulate_data

    torch.set_num_threads(1)
    cell = next(
        c
        for c in resolve_config("paper").cells()
        if (c.system, c.method, c.seed) == (system, "latent_ode", seed)
    )
    prepared = prepare_cell(cell, simulate_data(system, cell.data, seed))
    model, _ = build_cell_model(cell, prepared.train.obs_x.shape[-1])
    per_epoch: list[list[int]] = [[]]
    solve = latent_ode.dopri5_lanes

    def counted(*args, **kwargs):
        sol = solve(*args, **kwargs)
        per_epoch[-1].append(int((sol.accepted + sol.rejected).max()))
        return sol

    def next_epoch(record) -> None:
        per_epoch.append([])

    latent_ode.dopri5_lanes = counted  # instrumentation of this process only
    try:
        train(
            model,
            prepared.train,
            prepared.val,
            cell.training.fixed_epochs(epochs),
            seed=seed,
            on_epoch=next_epoch,
        )
    finally:
        latent_ode.dopri5_lanes = solve
    return [e for e in per_epoch if e]


def step_ops(budgets: tuple[int, int] = (16, 32), members: int = 5) -> tuple[float, float, int]:
    """(operators outside the latent solve, operators per solver iteration, the iterations its
    solve needs) of one packed training step (forward and backward) of the throughput table's
    Latent ODE (its data, 128 trajectories a batch, float64), counted at two budgets
    (:func:`benchmarks.step_kernels.step_operators`)."""
    from benchmarks.step_kernels import step_operators
    from benchmarks.throughput import models

    counts = []
    for budget in budgets:

        def with_budget(ms, budget=budget) -> None:
            for m in ms:
                m.solve_iterations = budget

        n, cells = step_operators(
            lambda seed: models("latent_ode", range(seed, seed + 1))[0],
            members=members,
            prepare=with_budget,
        )
        counts.append(n)
        needed = int(cells.packer.base._flags[1])
    per = (counts[1] - counts[0]) / (budgets[1] - budgets[0])
    return counts[0] - per * budgets[0], per, needed


def cpu_seconds_ratio(name: str, settings: dict, epochs: int = 3) -> float:
    """CPU seconds of an eager epoch of ``name`` built with ``settings`` over one at its
    defaults, on this CPU (one thread, the throughput table's data; the median of the epochs
    after the first, in CPU time: a busy machine slows both alike)."""
    import time

    import torch

    from benchmarks.throughput import models, splits
    from nltrain import TrainConfig, train

    torch.set_num_threads(1)
    tr, va = splits()
    cfg = TrainConfig(epochs=epochs, patience=None, batch_size=128, dtype="float64")
    medians = []
    for kw in ({}, settings):
        (model,) = models(name, range(1), kw)
        ticks: list[float] = []  # CPU time at each epoch's end

        def tick(_record, ticks: list[float] = ticks) -> None:
            ticks.append(time.process_time())

        train(model, tr, va, cfg, seed=0, step="eager", on_epoch=tick)
        medians.append(statistics.median(b - a for a, b in itertools.pairwise(ticks)))
    return medians[1] / medians[0]


def project_adjoint(rows: list) -> str:
    """The rows of ``benchmarks.throughput.ADJOINT_MODELS`` timed at their defaults (Euler,
    back-propagation through the solve), made the paper profile's (the adjoint, which a GPU
    check has not timed yet): each CUDA timing (one cell, packs, graphs) × the operators of a
    packed epoch with the adjoint over one without
    (:func:`benchmarks.step_kernels.epoch_operators`, counted on the CPU twin: a captured
    step's kernels), each CPU timing (the eager step) × the CPU time of an eager epoch with the
    adjoint over one without, measured here (:func:`cpu_seconds_ratio`); marked projected.
    Returns the sentence the record's note says it with ('' if no row was timed at its
    defaults)."""
    from benchmarks.step_kernels import epoch_operators
    from benchmarks.throughput import ADJOINT_MODELS, models
    from tasks.config import resolve_config

    said = []
    for name in ADJOINT_MODELS:
        mine = [r for r in rows if r.model == name and not r.settings.get("adjoint")]
        if not mine:
            continue
        paper = dict(resolve_config("paper").models[name])
        ops = [
            epoch_operators(lambda s, n=name, kw=kw: models(n, range(s, s + 1), kw)[0], members=5)
            for kw in ({}, paper)
        ]
        kernels, cpu = ops[1] / ops[0], cpu_seconds_ratio(name, paper)
        for r in mine:
            scale = kernels if r.device == "cuda" else cpu
            r.seconds = {m: v * scale for m, v in r.seconds.items()}
            r.eager_packed = {m: v * scale for m, v in r.eager_packed.items()}
            r.projected = sorted({*r.projected, *r.seconds, *r.eager_packed})
            r.settings = paper
        said.append(
            f"{name} ×{kernels:.2f} on CUDA ({ops[1]} operators a packed epoch against "
            f"{ops[0]}) and ×{cpu:.2f} on the CPU"
        )
    if not said:
        return ""
    return (
        "The paper profile trains NODE and ANODE through the adjoint (Euler, odeint_adjoint "
        "with the semi-norm; on CUDA packed, nlmodels.baselines._euler.euler_adjoint), which "
        "that check timed at their defaults only (Euler, back-propagation through the solve): "
        "their rows are projected from those timings, CUDA ones × the operators of a packed "
        "epoch with the adjoint over one without (counted on the CPU twin: a captured step's "
        "kernels), CPU ones (the eager step, torchdiffeq's adjoint) × the CPU time of an eager "
        "epoch with the adjoint over one without, measured on this project's CPU: "
        + "; ".join(said)
        + "; not measured: a GPU check with throughput.py --paper-settings node anode "
        "measures them."
    )


def project_captured(folder: Path, steps: Path, record: bool) -> None:
    """The paper profile projected from a GPU check's folder, its Latent ODE captured (see the
    module's docstring)."""
    import json
    import math

    from benchmarks.throughput import (
        PROJECTION_COLUMNS,
        project,
        projection_markdown,
        projection_rows,
        projection_sentences,
        read_timings,
    )
    from nlmodels.baselines.latent_ode import CAPTURE_FLOOR, CAPTURE_HEADROOM

    facts = json.loads((folder / "check.json").read_text())
    rows = read_timings(folder / "throughput.json")
    peak = max(
        int(r[COLUMNS.index("max, all epochs")]) for r in json.loads(steps.read_text())["rows"]
    )
    budget = max(CAPTURE_FLOOR, CAPTURE_HEADROOM * peak)
    base, per, needed = step_ops()
    eager_iterations = 4 * math.ceil(needed / 4)
    kernels = (base + per * budget) / (base + per * eager_iterations)
    graphed = [r for r in rows if r.device == "cuda" and r.dtype == "float64" and 30 in r.seconds]
    gain5 = min(r.eager_packed[5] / r.seconds[5] for r in graphed)
    gain30 = min(r.seconds[5] / r.seconds[30] for r in graphed)
    latent = next(
        r for r in rows if (r.model, r.device, r.dtype) == ("latent_ode", "cuda", "float64")
    )
    if 5 in latent.seconds:  # measured there: nothing to project
        raise SystemExit(f"{folder}: the Latent ODE's captured packs were measured there")
    latent.seconds[5] = latent.eager_packed[5] * kernels / gain5
    latent.seconds[30] = latent.seconds[5] / gain30
    latent.projected = [5, 30]
    adjoint = project_adjoint(rows)  # (after the gains: it scales a row's timings alike)
    p = project(rows, workers=facts["workers"], cuda=True, free_bytes=facts["free_bytes"])
    print(projection_markdown(p))
    places = {c.device for c in p.packs if c.method == "latent_ode"}
    head, tail = projection_sentences(p)
    note = (
        f"{head} {tail} Measured on the GPU ({facts['machine']}, make gpu-check, "
        f"{folder.as_posix()}): every timing but the Latent ODE's captured packs, which that "
        f"machine could not capture then and are projected here on the CPU twin "
        f"(benchmarks/latent_ode_steps.py --project): its eager pack of 5 there "
        f"({latent.eager_packed[5]:.4f} s/cell-epoch) × the kernels of a captured step over "
        f"an eager one ({kernels:.2f}: {base:.0f} operators outside the solve, {per:.0f} per "
        f"iteration; {eager_iterations} eager iterations on that data, a budget of {budget} "
        f"for the paper's solves, which needed at most {peak} in latent_ode_steps) ÷ the "
        f"smallest gain graphs gave another model there (×5: {gain5:.2f}; ×30 over ×5: "
        f"{gain30:.2f}): graphs ×5 {latent.seconds[5]:.4f}, ×30 {latent.seconds[30]:.4f} "
        f"s/cell-epoch, not measured; a GPU check measures them. The plan puts the Latent "
        f"ODE's packs on: {', '.join(sorted(places))} (where they shorten the whole plan)."
        + (f" {adjoint}" if adjoint else "")
    )
    if record:
        from tasks.reports.measurements import record_measurement

        path = record_measurement(
            "gpu_projection", "The full paper profile projected on this machine",
            f"PYTHONPATH=. python benchmarks/latent_ode_steps.py --project {folder.as_posix()} "
            "--record", PROJECTION_COLUMNS, projection_rows(p), note, machine=facts["machine"],
        )  # fmt: skip
        print(f"recorded: {path}")
    else:
        print(note)


def record_steps(rows: list, epochs: int) -> Path:
    """Write the counts' record ``results/measurements/latent_ode_steps.json``."""
    from tasks.reports.measurements import record_measurement

    note = (
        f"The paper profile's Latent ODE cell (seed 0) of each system trained {epochs} "
        "epochs on the CPU (one thread; seconds include simulation and validation); each "
        "figure is the iterations one latent dopri5 solve needs (accepted plus rejected "
        "steps of its slowest lane: the whole batch is one lane), over the training and "
        "validation solves of an epoch. A solve captured into a CUDA graph runs a fixed "
        "budget of iterations chosen before capture from such counts."
    )
    return record_measurement(
        "latent_ode_steps",
        "dopri5 iterations per latent solve of the Latent ODE (paper profile)",
        f"PYTHONPATH=. python benchmarks/latent_ode_steps.py --epochs {epochs} --record",
        COLUMNS,
        rows,
        note,
    )


def main(argv: list[str] | None = None) -> int:
    import time

    from nlmodels import set_up_numerics

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=30, help="epochs per system (default 30)")
    ap.add_argument("--systems", nargs="+", default=list(MAIN_SYSTEMS))
    ap.add_argument("--record", action="store_true", help="write results/measurements/")
    ap.add_argument("--project", metavar="DIR", type=Path, help="a gpu-check folder: project")
    args = ap.parse_args(argv)
    set_up_numerics()
    if args.project:
        steps = Path(__file__).resolve().parents[1] / "results/measurements/latent_ode_steps.json"
        project_captured(args.project, steps, args.record)
        return 0
    rows = []
    for system in args.systems:
        t0 = time.perf_counter()
        epochs = count_steps(system, args.epochs)
        secs = (time.perf_counter() - t0) / len(epochs)
        row = (
            system,
            len(epochs),
            max(epochs[0]),
            max(max(e) for e in epochs),
            max(epochs[-1]),
            statistics.median(epochs[-1]),
            f"{secs:.1f}",
        )
        print(" | ".join(str(c) for c in row), flush=True)
        rows.append(row)
    if args.record:
        print(f"recorded: {record_steps(rows, args.epochs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
