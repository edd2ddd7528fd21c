"""``nllab study wallclock``: seconds per training epoch of every model on Lotka–Volterra
(paper Table 11, ``wallclocktime``; the paper timed 1000 trajectories on a V100 GPU, so the gap
column compares different hardware). Times the training loop a cell runs
(:func:`nltrain.epoch_seconds`), one validation batch included. The paper averaged each model
over a 1000-epoch training; the paper profile averages 5 epochs (an epoch's time does not
depend on how many follow, and 1000 epochs of NODE with dopri5 on a CPU take days).

A timing is the machine's, not a model's: the results ledger keeps this table as a committed
measurement (``results/measurements/wallclock.json``, :meth:`StudyContext.measurement`, written
by ``benchmarks/study_measurements.py --record --studies wallclock``) with the processor named,
and every row says the device it was timed on (``CPU``); it trains no ledger cell."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from datasets import SplitData
from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec
from flows.studies._plots import plot_bars
from flows.studies._tables import add_paper
from nltrain import epoch_seconds as loop_epoch_seconds
from nltrain import seeded, torch_threads
from tasks.cell import simulate_data
from tasks.config import TrainConfig

#: (method, solver) as in Table 11; solver "–" for models without one.
VARIANTS = (
    ("node", "euler"),
    ("node", "dopri5"),
    ("anode", "euler"),
    ("anode", "dopri5"),
    ("latent_ode", "–"),
    ("nf_coupling", "–"),
    ("nf_resnet", "–"),
    ("neural_laplace", "–"),
)
_PAPER = (1.92, 13.78, 4.56, 17.23, 3.56, 10.83, 0.1, 0.1)
SPEC = StudySpec(
    name="wallclock",
    paper={v: p for v, p in zip(VARIANTS, _PAPER, strict=True)},
    metric="seconds per epoch",
)
KEYS = ("method", "solver")


@task(name="epoch-seconds", cache_policy=NO_CACHE)
def epoch_seconds(
    method: str,
    solver: str,
    settings: Mapping[str, Any],
    x: np.ndarray,
    t: np.ndarray,
    config: TrainConfig,
    seed: int,
) -> dict:
    """Mean seconds per epoch (and NFE per batch) of one freshly built model with ``settings``
    (its ``build_model`` keywords), trained as a cell is for ``config.epochs`` epochs (first
    half of each trajectory observed)."""
    from nlmodels import build_model

    with seeded(seed):
        model = build_model(method, x.shape[-1], **settings)
    half = t.shape[0] // 2
    train = SplitData.from_trajectories(t, x, half)
    val = SplitData.from_trajectories(t, x[: config.batch_size], half)
    secs, nfe = loop_epoch_seconds(model, train, val, config, seed=seed)
    return {"method": method, "solver": solver, "value": secs, "nfe_per_batch": nfe}


def _settings(ctx: StudyContext, method: str, solver: str) -> dict[str, Any]:
    """The model's settings in this profile (at the paper's budget the reference's NODE and
    ANODE: their start, adjoint and an adaptive solver's tolerances), with ``solver``."""
    return {**ctx.run.models.get(method, {}), **({} if solver == "–" else ctx.ode_solver(solver))}


def _timed(ctx: StudyContext, variants: list[tuple[str, str]], n: int, epochs: int) -> pd.DataFrame:
    """Seconds per epoch (mean, std and n over seeds) and NFE per batch of each variant, on
    this machine's CPU."""
    system = ctx.systems(("lotka_volterra_dde",))[0]
    data = ctx.run.data.model_copy(update={"n_trajectories": n, "noise_std": 0.0})
    ds = simulate_data(system, data, ctx.seeds[0])
    x = (ds.x - ds.x.mean(axis=(0, 1))) / ds.x.std(axis=(0, 1))
    config = ctx.run.training.fixed_epochs(epochs)
    used = ctx.run.execution.torch_threads or torch.get_num_threads()
    with torch_threads(used):
        rows = [
            epoch_seconds(m, s, _settings(ctx, m, s), x, np.asarray(ds.t), config, seed)
            for m, s in variants
            for seed in ctx.seeds
        ]
    frame = pd.DataFrame(rows)
    g = frame.groupby(list(KEYS), sort=False)
    table = g.agg(value=("value", "mean"), std=("value", "std"), n=("value", "size"),
                  nfe_per_batch=("nfe_per_batch", "mean")).reset_index()  # fmt: skip
    table["std"] = table["std"].fillna(0.0)
    table["device"] = f"CPU, {used} torch thread{'s' if used > 1 else ''}"
    return table


def _body(ctx: StudyContext) -> StudyOutput:
    """Table 11: seconds per training epoch for every model."""
    n = ctx.pick(smoke=40, quick=1000, paper=1000)
    epochs = ctx.pick(smoke=1, quick=1, paper=5)
    methods = ctx.config.methods
    variants = [v for v in VARIANTS if methods is None or v[0] in methods]
    if ctx.profile == "smoke" and methods is None:
        variants = [("node", "euler"), ("neural_laplace", "–")]
    measured = ctx.measurement("wallclock", lambda: _timed(ctx, variants, n, epochs))
    table = pd.DataFrame(variants, columns=list(KEYS))
    if not measured.empty:  # (a variant not timed keeps its row, without a value)
        table = table.merge(measured.drop(columns="n_trajectories", errors="ignore"), how="left")
    for column in ("value", "std", "n", "nfe_per_batch", "device"):
        if column not in table:
            table[column] = math.nan if column != "device" else "–"
    table = add_paper(table, KEYS, SPEC.paper)
    nl = table.loc[table.method == "neural_laplace", "value"]
    table["x_neural_laplace"] = table["value"] / float(nl.iloc[0]) if len(nl) else math.nan
    table["n_trajectories"] = n
    plot_bars(table.assign(model=table.method + " " + table.solver, group="epoch"), "model",
              "group", ctx.figure("wallclock"), title=SPEC.title, ylabel="s / epoch")  # fmt: skip
    return StudyOutput(
        {"wallclock": table},
        notes=f"{n} trajectories, batch {ctx.run.training.batch_size}, {epochs} epoch(s), on the "
        "device each row names; the paper used a V100 GPU.",
    )


STUDY = Study(SPEC, _body)
