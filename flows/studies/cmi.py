"""``nllab study cmi``: conditional mutual information between the true and the predicted
extrapolations given the initial condition (paper ``Table:CMI``; higher is better).

Each finished cell's model (from its MLflow artifact) predicts its test split; the KSG-type
estimator :func:`datasets.cmi.conditional_mutual_information` estimates I(x_true; x_pred | x0) with
whole extrapolated halves as samples, in bits (base 2, NPEET's default, the toolbox the paper
used).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from datasets.cmi import conditional_mutual_information
from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec, run_model
from flows.studies._plots import plot_bars
from flows.studies._tables import add_paper, aggregate, paper_rows
from nltrain import predict
from tasks.cell import prepare_cell, simulate_data
from tasks.config import PAPER_METHODS
from tasks.ledger.measured import Measured

if TYPE_CHECKING:
    from tasks.config import CellConfig
    from tasks.results import CellResult
    from tasks.tracking import Queries

#: Table:CMI (5 seeds, the Table 3 cells): system -> CMI of the rows NODE … Neural Laplace
_PAPER = {
    "mackey_glass_dde": (0.2899, 0.2865, 1.3736, 1.5569, 1.5730, 1.6011),
    "lotka_volterra_dde": (3.2479, 3.2398, 3.3908, 2.1696, 3.4854, 3.7913),
    "stiff_van_der_pol": (2.8658, 2.9679, 2.7692, 2.7183, 3.0832, 3.3224),
}
SYSTEMS = tuple(_PAPER)
SPEC = StudySpec(
    name="cmi",
    paper=paper_rows({(system,): row for system, row in _PAPER.items()}),
    metric="CMI (bits)",
    higher_is_better=True,
)
KEYS = ("system", "method")
BASE = 2.0
#: The name the results ledger records each cell's CMI under.
MEASURE = "cmi_bits"


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


def cmi_of_run(
    cell: CellConfig, run_id: str, queries: Queries, cache_dir: Path | None = None
) -> float:
    """I(truth; prediction | initial condition) in bits of the model that cell ``cell`` trained
    (its MLflow run ``run_id``) on its test split (``cache_dir``: the data cache, None:
    simulated afresh, the same data either way)."""
    model, spec = run_model(queries, run_id)
    test = prepare_cell(cell, simulate_data(cell.system, cell.data, cell.seed, cache_dir)).test
    pred = predict(model, test, dtype=spec.dtype, batch_size=cell.training.batch_size)
    return estimate_cmi.fn(np.asarray(test.target), pred, np.asarray(test.ic), cell.seed)


def measure_run(
    cell: CellConfig, run_id: str, queries: Queries, cache_dir: Path | None = None
) -> Measured:
    """:func:`cmi_of_run` as the ledger records it: the measure :data:`MEASURE`."""
    return Measured({MEASURE: cmi_of_run(cell, run_id, queries, cache_dir)})


def _measure(cell: CellConfig, result: CellResult, ctx: StudyContext) -> Measured:
    return measure_run(cell, result.run_id or "", ctx.queries, ctx.runtime.cache_dir)


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
        measured = ctx.measured(r, functools.partial(_measure, cell, r, ctx))
        records.append({**lab, "value": measured.measures.get(MEASURE, math.nan)})
    table = add_paper(aggregate(records, KEYS), KEYS, SPEC.paper, higher_is_better=True)
    plot_bars(table, "system", "method", ctx.figure("cmi"), title="CMI", ylabel="CMI (bits)")
    return StudyOutput({"cmi": table}, notes="KSG-type CMI (datasets), base 2, k = 3.")


STUDY = Study(SPEC, _body, measure=measure_run)
