"""``nllab study observation-size``: number of observed points on stiff Van der Pol with noise
σ = 0.01, same extrapolation points, all models, 1000 trajectories, 200 epochs, 5 seeds (paper
figure ``ObservationSizeScaling``; the paper shows it as a figure only, so the table has no
published numbers, and it does not list the counts of observed points: 5 … 100 are the counts
the reference code's ``--observe_step`` 20, 10, 4, 2, 1 give on its 100 observed points).

At the paper's budget the noise is added as the reference code adds it, after the z-score, in
normalised units (``data.noise_on = "normalised"``): in physical units σ = 0.01 is about the
whole scale of stiff Van der Pol's y; the smoke and quick profiles keep it there."""

from __future__ import annotations

from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec, rmse_table
from flows.studies._plots import plot_lines
from tasks.config import PAPER_METHODS

N_OBSERVED = (5, 10, 25, 50, 100)
NOISE_STD = 0.01
#: The reference code adds the noise after normalising (``DataConfig.noise_on``).
PAPER_NOISE_ON = "normalised"
#: "Each dataset was trained for 200 epochs, with 1000 sampled trajectories"
PAPER_EPOCHS = 200
SPEC = StudySpec(
    name="observation-size",
)
KEYS = ("system", "n_observed", "method")


def _body(ctx: StudyContext) -> StudyOutput:
    """Figure ObservationSizeScaling: test RMSE against the number of observed points."""
    systems = ctx.systems(("stiff_van_der_pol",))
    methods = ctx.methods(
        ctx.pick(smoke=("node", "neural_laplace"), quick=PAPER_METHODS, paper=PAPER_METHODS)
    )
    sizes = ctx.pick(smoke=(10, 100), quick=(10, 50, 100), paper=N_OBSERVED)
    training = ctx.pick(smoke={}, quick={}, paper={"epochs": PAPER_EPOCHS})
    noise = {
        "noise_std": NOISE_STD,
        "noise_on": ctx.pick(smoke="raw", quick="raw", paper=PAPER_NOISE_ON),
    }
    entries = [
        (
            {"system": s, "n_observed": k, "method": m},
            ctx.cell(s, m, seed, data={**noise, "n_observed": k}, training=training),
        )
        for s in systems
        for k in sizes
        for m in methods
        for seed in ctx.seeds
    ]
    table = rmse_table(ctx, entries, KEYS)
    plot_lines(table, "n_observed", "method", ctx.figure("observation_size"), title=SPEC.title,
               logx=True, panel="system")  # fmt: skip
    return StudyOutput({"observation_size": table})


STUDY = Study(SPEC, _body)
