"""``nllab study ilt``: the inverse Laplace transform algorithms — accuracy and speed on
F(s) = s/(s²+1) (paper Table 12, ``ILTtimeres``) and Neural Laplace trained with each of them
(training-loss curves, as the paper's FSI vs CME figure ``ILTcompar``: Lotka–Volterra, 3 seeds;
the paper profile trains the two algorithms the figure compares, the quick profile all five).

The accuracy table is measured by :func:`nlmodels.diagnostics.ilt_accuracy`, the function that
``benchmarks/ilt_table.py`` prints too: maths and a timing, no trained model, so the results
ledger keeps it as a committed measurement (``results/measurements/ilt_accuracy.json``,
:meth:`StudyContext.measurement`). The training cells are ledger cells (the Fourier ones are
Table 3's Neural Laplace cells); each record carries its training loss per epoch as the curve
:data:`MEASURE` (:func:`loss_curve`), which the figure draws.
"""

from __future__ import annotations

import math
from functools import partial

import matplotlib.pyplot as plt
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.studies._core import (
    Factor,
    Study,
    StudyContext,
    StudyOutput,
    StudySpec,
    rmse_table_and_results,
)
from flows.studies._tables import add_paper
from tasks.config import CellConfig
from tasks.ledger.measured import Measured, downsample
from tasks.tracking import Queries
from tasks.tracking.tags import Metrics

TERMS = 33
TRAINED = ("fourier", "dehoog", "talbot", "stehfest", "cme")
#: The algorithms figure ILTcompar trains with ("Neural Laplace converges faster when using the
#: Fourier (FSI) ILT algorithm compared to using the CME ILT algorithm").
PAPER_TRAINED = ("fourier", "cme")
#: The curve each trained cell's record carries: its training loss per epoch.
MEASURE = "train_loss"
#: The measurement (``results/measurements/NAME.json``) of the accuracy table.
ACCURACY = "ilt_accuracy"


def _paper() -> dict[tuple[str, ...], float]:
    from nlmodels import diagnostics as bench

    return {(name,): v for name, v in bench.PAPER_ILT_RMSE.items() if v is not None}


SPEC = StudySpec(
    name="ilt",
    paper=_paper(),
    factor=Factor("model", "ilt", TRAINED, ("neural_laplace",)),
)


@task(name="ilt-accuracy", cache_policy=NO_CACHE)
def ilt_accuracy(terms: int, repeats: int) -> pd.DataFrame:
    """RMSE against cos t and µs per time point of every algorithm (one torch thread)."""
    from nlmodels import diagnostics as bench
    from nltrain import torch_threads

    with torch_threads(1):
        ours = bench.ilt_accuracy(terms, repeats)
    first = bench.ILT_PAIRS[0][0]
    rows = [
        {
            "algorithm": name,
            "value": ours[f"{name}|{first}"]["rmse"],
            "std": math.nan,
            "n": 1,
            "us_per_point": ours[f"{name}|{first}"]["us"],
        }
        for name in bench.ILT_ORDER
    ]
    return pd.DataFrame(rows)


def loss_curve(cell: CellConfig, run_id: str, queries: Queries) -> Measured:
    """The training loss per epoch of ``cell``'s run ``run_id`` (as it logged it), cut to the
    points a record keeps (:func:`tasks.ledger.downsample`): the curve :data:`MEASURE`."""
    history = queries.metric_history(run_id, Metrics.TRAIN_LOSS)
    if not history:
        raise ValueError(f"run {run_id} of {cell.key} logged no {Metrics.TRAIN_LOSS}")
    return Measured(curves={MEASURE: downsample([(float(s), v) for s, v in history])})


def _accuracy(ctx: StudyContext) -> pd.DataFrame:
    """Table 12, every algorithm in the paper's order (a row without a value where nothing is
    measured yet)."""
    from nlmodels import diagnostics as bench

    repeats = ctx.pick(smoke=3, quick=30, paper=100)
    measured = ctx.measurement(ACCURACY, lambda: ilt_accuracy(TERMS, repeats))
    rows = pd.DataFrame({"algorithm": bench.ILT_ORDER})
    if not measured.empty:
        rows = rows.merge(measured, on="algorithm", how="left")
    for column in ("value", "std", "n", "us_per_point"):
        if column not in rows:
            rows[column] = math.nan
    accuracy = add_paper(rows, ("algorithm",), SPEC.paper)
    cols = ["algorithm", "value", "std", "n", "paper", "gap", "verdict", "us_per_point"]
    return accuracy[cols]


def _body(ctx: StudyContext) -> StudyOutput:
    """Table 12 and figure ILTcompar: ILT accuracy/speed and training with each ILT."""
    accuracy = _accuracy(ctx)
    systems = ctx.systems(("lotka_volterra_dde",))
    ilts = ctx.pick(smoke=("fourier", "cme"), quick=TRAINED, paper=PAPER_TRAINED)
    entries = ctx.factor_cells(systems, ilts)
    # No published RMSE for these runs: the paper shows their loss curves only.
    training, results = rmse_table_and_results(ctx, entries, ("system", "ilt"))
    fig, axes = plt.subplots(1, len(systems), figsize=(5 * len(systems), 3.4), squeeze=False)
    for ax, s in zip(axes[0], systems, strict=True):
        drawn = False
        for i, name in enumerate(ilts):
            for (lab, cell), r in zip(entries, results, strict=True):
                if (lab["system"], lab["ilt"]) != (s, name):
                    continue
                measured = ctx.measured(r, partial(loss_curve, cell, r.run_id or "", ctx.queries))
                curve = measured.curves.get(MEASURE)
                if curve:
                    epochs, losses = zip(*curve, strict=True)
                    ax.plot(epochs, losses, color=f"C{i}", lw=1, label=f"{name} seed {r.seed}")
                    drawn = True
        if drawn:
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        else:  # (drawn from the ledger before a record has its curve)
            ax.text(0.5, 0.5, "no curve recorded yet", ha="center", transform=ax.transAxes)
        ax.set_xlabel("epoch")
        ax.set_ylabel("training loss (MSE)")
        ax.set_title(s)
    fig.suptitle("Neural Laplace training loss by ILT algorithm")
    fig.tight_layout()
    fig.savefig(ctx.figure("ilt_training_loss"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.bar(accuracy.algorithm, accuracy.value, color="C0", label="ours")
    ax.plot(accuracy.algorithm, accuracy.paper, "kx", ms=7, label="paper")
    ax.set_yscale("log")
    ax.set_ylabel("RMSE vs cos t")
    ax.set_title(f"ILT accuracy, {TERMS} terms (Table 12)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(ctx.figure("ilt_accuracy"), dpi=110)
    plt.close(fig)
    return StudyOutput({"ilt_accuracy": accuracy, "ilt_training": training})


STUDY = Study(SPEC, _body, measure=loss_curve)
