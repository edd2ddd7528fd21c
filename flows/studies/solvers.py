"""``nllab study solvers``: NODE and ANODE with the adaptive dopri5 solver against euler, with
Neural Laplace alongside (paper Table 10, ``Table:AdditionalMSE``; euler figures from Table 3)."""

from __future__ import annotations

from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec, rmse_table
from flows.studies._plots import plot_bars
from tasks.reports import PAPER_MAIN_TABLE

SYSTEMS = ("lotka_volterra_dde", "piecewise_forcing_ode")
SOLVERS = ("euler", "dopri5")
_DOPRI5 = {
    ("lotka_volterra_dde", "node"): 0.5880,
    ("piecewise_forcing_ode", "node"): 0.1945,
    ("lotka_volterra_dde", "anode"): 0.5673,
    ("piecewise_forcing_ode", "anode"): 0.0769,
}
_NL = {"lotka_volterra_dde": 0.0427, "piecewise_forcing_ode": 0.0037}
SPEC = StudySpec(
    name="solvers",
    paper={
        **{(s, m, "dopri5"): v for (s, m), v in _DOPRI5.items()},
        **{
            (s, m, "euler"): PAPER_MAIN_TABLE[(m, s)].mean
            for s in SYSTEMS
            for m in ("node", "anode")
        },
        **{(s, "neural_laplace", "–"): v for s, v in _NL.items()},
    },
)
KEYS = ("system", "method", "solver")


def _body(ctx: StudyContext) -> StudyOutput:
    """Table 10: NODE/ANODE with dopri5 vs euler, Neural Laplace alongside."""
    systems = ctx.systems(ctx.pick(smoke=SYSTEMS[1:], quick=SYSTEMS, paper=SYSTEMS))
    baselines = ctx.pick(smoke=("node",), quick=("node", "anode"), paper=("node", "anode"))
    entries = []
    for s in systems:
        for seed in ctx.seeds:
            for m in baselines:
                for solver in SOLVERS:
                    cell = ctx.cell(s, m, seed, model=ctx.ode_solver(solver))
                    entries.append(({"system": s, "method": m, "solver": solver}, cell))
            nl = ctx.cell(s, "neural_laplace", seed)
            entries.append(({"system": s, "method": "neural_laplace", "solver": "–"}, nl))
    table = rmse_table(ctx, entries, KEYS)
    fig = table.assign(model=table.method + " " + table.solver)
    plot_bars(fig, "system", "model", ctx.figure("solvers"), title=SPEC.title)
    return StudyOutput({"solvers": table})


STUDY = Study(SPEC, _body)
