"""``nllab study stereographic``: Neural Laplace with and without the Riemann-sphere map
(paper Table 5, ``Table:ablate``, top block)."""

from __future__ import annotations

from flows.studies._core import Factor, Study, StudyContext, StudyOutput, StudySpec, rmse_table
from flows.studies._plots import plot_bars
from tasks.reports import PAPER_STEREOGRAPHIC

SYSTEMS = tuple(PAPER_STEREOGRAPHIC)
FACTOR = Factor("model", "stereographic", (False, True), ("neural_laplace",))
SPEC = StudySpec(
    name="stereographic",
    paper={
        (system, state): v.mean
        for system, row in PAPER_STEREOGRAPHIC.items()
        for state, v in zip(("off", "on"), row, strict=True)
    },
    factor=FACTOR,
)
KEYS = ("system", "stereographic")


def _body(ctx: StudyContext) -> StudyOutput:
    """Table 5: the Riemann-sphere map on/off for Neural Laplace."""
    systems = ctx.systems(ctx.pick(smoke=SYSTEMS[2:3], quick=SYSTEMS, paper=SYSTEMS))
    # "on" is the model's default, which the config hash ignores: those cells are the
    # benchmark's own Neural Laplace cells, reused when the benchmark has run.
    entries = ctx.factor_cells(systems, FACTOR.values, label=lambda on: "on" if on else "off")
    table = rmse_table(ctx, entries, KEYS)
    plot_bars(table, "system", "stereographic", ctx.figure("stereographic"), title=SPEC.title)
    return StudyOutput({"stereographic": table})


STUDY = Study(SPEC, _body)
