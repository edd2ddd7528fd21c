"""``nllab study latent-dim``: sensitivity to the latent size K of p (paper Table 5,
``Table:ablate``, bottom block; Lotka–Volterra)."""

from __future__ import annotations

from flows.studies._core import Factor, Study, StudyContext, StudyOutput, StudySpec, rmse_table
from flows.studies._plots import plot_lines

K_VALUES = (1, 2, 4, 8, 16, 32)
_PAPER = (0.4416, 0.0405, 0.0427, 0.0408, 0.0380, 0.0398)
SPEC = StudySpec(
    name="latent-dim",
    paper={("lotka_volterra_dde", str(k)): v for k, v in zip(K_VALUES, _PAPER, strict=True)},
    factor=Factor("model", "latent_dim", K_VALUES, ("neural_laplace",)),
)
KEYS = ("system", "latent_dim")


def _body(ctx: StudyContext) -> StudyOutput:
    """Table 5: test RMSE for K ∈ {1, 2, 4, 8, 16, 32}."""
    systems = ctx.systems(("lotka_volterra_dde",))
    ks = ctx.pick(smoke=(1, 2), quick=K_VALUES, paper=K_VALUES)
    entries = ctx.factor_cells(systems, ks)
    table = rmse_table(ctx, entries, KEYS)
    plot_lines(table, "latent_dim", "system", ctx.figure("latent_dim"), title=SPEC.title, logx=True)
    return StudyOutput({"latent_dim": table})


STUDY = Study(SPEC, _body)
