"""``nllab study latent-dim``: sensitivity to the latent size K of p (paper Table 5,
``Table:ablate``, bottom block: K ∈ {1, 2, 4, 8, 16, 32} on Lotka–Volterra, stiff Van der Pol,
piecewise forcing and the integro-DE, 5 seeds; the smaller profiles run Lotka–Volterra only).

K = 2 is the model's default, so those cells are Table 3's own Neural Laplace cells."""

from __future__ import annotations

from flows.studies._core import Factor, Study, StudyContext, StudyOutput, StudySpec, rmse_table
from flows.studies._plots import plot_lines

K_VALUES = (1, 2, 4, 8, 16, 32)
#: Table:ablate, "Dimensionality K" rows: system -> test RMSE for each K of K_VALUES
_PAPER = {
    "lotka_volterra_dde": (0.4416, 0.0405, 0.0427, 0.0408, 0.0380, 0.0398),
    "stiff_van_der_pol": (0.1520, 0.1308, 0.1334, 0.1294, 0.1334, 0.1337),
    "piecewise_forcing_ode": (0.0036, 0.0033, 0.0038, 0.0038, 0.0036, 0.0032),
    "integro_de": (0.0010, 0.0012, 0.0012, 0.0010, 0.0012, 0.0013),
}
SYSTEMS = tuple(_PAPER)
SPEC = StudySpec(
    name="latent-dim",
    paper={
        (system, str(k)): v
        for system, row in _PAPER.items()
        for k, v in zip(K_VALUES, row, strict=True)
    },
    factor=Factor("model", "latent_dim", K_VALUES, ("neural_laplace",)),
)
KEYS = ("system", "latent_dim")


def _body(ctx: StudyContext) -> StudyOutput:
    """Table 5: test RMSE for K ∈ {1, 2, 4, 8, 16, 32}."""
    systems = ctx.systems(ctx.pick(smoke=SYSTEMS[:1], quick=SYSTEMS[:1], paper=SYSTEMS))
    ks = ctx.pick(smoke=(1, 2), quick=K_VALUES, paper=K_VALUES)
    entries = ctx.factor_cells(systems, ks)
    table = rmse_table(ctx, entries, KEYS)
    plot_lines(table, "latent_dim", "system", ctx.figure("latent_dim"), title=SPEC.title, logx=True)
    return StudyOutput({"latent_dim": table})


STUDY = Study(SPEC, _body)
