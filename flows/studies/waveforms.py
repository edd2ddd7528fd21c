"""``nllab study waveforms``: sine, square and sawtooth extrapolation, all models (paper
``Table:toywaveforms``: 5 seeds, 1000 epochs)."""

from __future__ import annotations

from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec, rmse_table
from flows.studies._plots import plot_bars
from flows.studies._tables import paper_rows
from tasks.config import PAPER_METHODS

#: Table:toywaveforms (5 seeds, 1000 epochs): system -> test RMSE of the rows NODE … Neural Laplace
_PAPER = {
    "sine": (0.9657, 0.7430, 0.1290, 0.1060, 0.1482, 0.0063),
    "square": (0.9769, 0.8153, 0.3443, 0.2768, 0.2176, 0.1678),
    "sawtooth": (0.9772, 0.3001, 0.3404, 0.4443, 0.3790, 0.1600),
}
SYSTEMS = tuple(_PAPER)
SPEC = StudySpec(name="waveforms", paper=paper_rows({(s,): row for s, row in _PAPER.items()}))
KEYS = ("system", "method")


def _body(ctx: StudyContext) -> StudyOutput:
    """Table:toywaveforms: test RMSE on sine, square and sawtooth."""
    systems = ctx.systems(ctx.pick(smoke=SYSTEMS[:1], quick=SYSTEMS, paper=SYSTEMS))
    methods = ctx.methods(
        ctx.pick(smoke=("node", "neural_laplace"), quick=PAPER_METHODS, paper=PAPER_METHODS)
    )
    entries = [
        ({"system": s, "method": m}, ctx.cell(s, m, seed))
        for s in systems
        for m in methods
        for seed in ctx.seeds
    ]
    table = rmse_table(ctx, entries, KEYS)
    plot_bars(table, "system", "method", ctx.figure("waveforms"), title=SPEC.title)
    return StudyOutput({"waveforms": table})


STUDY = Study(SPEC, _body)
