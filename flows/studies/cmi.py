"""``nllab study cmi``: conditional mutual information between the true and the predicted
extrapolations given the initial condition (paper ``Table:CMI``; higher is better).

Each finished cell's model (from its MLflow artifact) predicts its test split; the KSG-type
estimator :func:`datasets.cmi.conditional_mutual_information` estimates I(x_true; x_pred | x0) with
whole extrapolated halves as samples, in bits (base 2, NPEET's default, the toolbox the paper
used).
"""

from __future__ import annotations

import math

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from datasets.cmi import conditional_mutual_information
from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec
from flows.studies._plots import plot_bars
from flows.studies._tables import add_paper, aggregate
from nltrain import predict
from tasks.config import PAPER_METHODS

_PAPER = {"mackey_glass_dde": 1.6011, "lotka_volterra_dde": 3.7913, "stiff_van_der_pol": 3.3224}
SYSTEMS = tuple(_PAPER)
SPEC = StudySpec(
    name="cmi",
    paper={(system, "neural_laplace"): v for system, v in _PAPER.items()},
    metric="CMI (bits)",
    higher_is_better=True,
)
KEYS = ("system", "method")
BASE = 2.0


def k_for(n: int) -> int:
    """NPEET's k = 3, smaller for tiny test sets (at least 1, below n / 4)."""
    return max(1, min(3, n // 4))


@task(name="cmi-estimate", cache_policy=NO_CACHE)
def estimate_cmi(truth: np.ndarray, pred: np.ndarray, ic: np.ndarray, seed: int) -> float:
    """I(truth; pred | ic) in bits, one row per test trajectory."""
    n = truth.shape[0]
    if n < 3:
        return math.nan
    return conditional_mutual_information(truth, pred, ic, k=k_for(n), base=BASE, seed=seed)


def _body(ctx: StudyContext) -> StudyOutput:
    """Table:CMI: conditional mutual information of the extrapolations."""
    systems = ctx.systems(ctx.pick(smoke=SYSTEMS[1:2], quick=SYSTEMS, paper=SYSTEMS))
    methods = ctx.methods(
        ctx.pick(smoke=("node", "neural_laplace"), quick=PAPER_METHODS, paper=PAPER_METHODS)
    )
    labels, cells = [], []
    for s in systems:
        for m in methods:
            for seed in ctx.seeds:
                labels.append({"system": s, "method": m})
                cells.append(ctx.cell(s, m, seed))
    results = ctx.run_cells(cells)
    records = []
    for lab, cell, r in zip(labels, cells, results, strict=True):
        value = math.nan
        if r.ok:
            model, spec = ctx.load_model(r)
            test = ctx.prepared(cell).test
            pred = predict(model, test, dtype=spec.dtype, batch_size=cell.training.batch_size)
            value = estimate_cmi(np.asarray(test.target), pred, np.asarray(test.ic), cell.seed)
        records.append({**lab, "value": value})
    table = add_paper(aggregate(records, KEYS), KEYS, SPEC.paper, higher_is_better=True)
    plot_bars(table, "system", "method", ctx.figure("cmi"), title="CMI", ylabel="CMI (bits)")
    return StudyOutput({"cmi": table}, notes="KSG-type CMI (datasets), base 2, k = 3.")


STUDY = Study(SPEC, _body)
