"""``nllab study noise``: Gaussian observation noise σ ∈ {0.01, 0.1}, all models (paper
``Table:AdditionalNoiseResult``, σ = 0.1; σ = 0.01 as in Appendix D)."""

from __future__ import annotations

from flows.studies._core import Factor, Study, StudyContext, StudyOutput, StudySpec, rmse_table
from flows.studies._plots import plot_bars
from tasks.config import PAPER_METHODS

_PAPER = {"lotka_volterra_dde": 0.1328, "integro_de": 0.0996, "piecewise_forcing_ode": 0.1006}
SYSTEMS = tuple(_PAPER)
SIGMAS = (0.01, 0.1)
SPEC = StudySpec(
    name="noise",
    paper={(system, "0.1", "neural_laplace"): v for system, v in _PAPER.items()},  # σ = 0.1
    factor=Factor("data", "noise_std", SIGMAS),
)
KEYS = ("system", "noise_std", "method")


def _body(ctx: StudyContext) -> StudyOutput:
    """Appendix D: test RMSE of every model under Gaussian noise."""
    systems = ctx.systems(ctx.pick(smoke=SYSTEMS[2:], quick=SYSTEMS, paper=SYSTEMS))
    methods = ctx.methods(
        ctx.pick(smoke=("node", "neural_laplace"), quick=PAPER_METHODS, paper=PAPER_METHODS)
    )
    sigmas = ctx.pick(smoke=(0.1,), quick=SIGMAS, paper=SIGMAS)
    entries = ctx.factor_cells(systems, sigmas, methods)
    table = rmse_table(ctx, entries, KEYS)
    for sigma in sigmas:
        plot_bars(
            table[table.noise_std == sigma],
            "system",
            "method",
            ctx.figure(f"noise_{sigma:g}"),
            title=f"{SPEC.title}, σ = {sigma:g}",
        )
    return StudyOutput({"noise": table})


STUDY = Study(SPEC, _body)
