"""``nllab study sample-size``: number of trajectories N ∈ {1000, …, 30} on Lotka–Volterra, all
models, 200 epochs in the paper profile (paper ``Table:datascaling``).

N is the data set size of the paper's protocol (80 % of it trains): the study keeps the
profile's data set (same validation and test trajectories for every N) and trains on
``n_train = round(0.8·N·n_trajectories/1000)`` of its training split, so a smaller profile scales
every N by the same factor. The table reports both N and the actual ``n_train``.
"""

from __future__ import annotations

from datasets import SYSTEMS as DATA_SYSTEMS
from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec, rmse_table
from flows.studies._plots import plot_lines
from tasks.config import PAPER_METHODS

SIZES = (1000, 500, 250, 125, 62, 30)
_PAPER = (0.1371, 0.2581, 0.3486, 0.5716, 0.7715, 0.9220)
SPEC = StudySpec(
    name="sample-size",
    paper={
        ("lotka_volterra_dde", str(n), "neural_laplace"): v
        for n, v in zip(SIZES, _PAPER, strict=True)
    },
)
KEYS = ("system", "N", "n_train", "method")


def n_train_for(n: int, n_trajectories: int, train_fraction: float) -> int:
    """Training trajectories standing for the paper's N in a data set of ``n_trajectories``."""
    return max(2, round(train_fraction * n * n_trajectories / 1000))


def _body(ctx: StudyContext) -> StudyOutput:
    """Table:datascaling: test RMSE against the number of trajectories."""
    systems = ctx.systems(("lotka_volterra_dde",))
    methods = ctx.methods(
        ctx.pick(smoke=("node", "neural_laplace"), quick=PAPER_METHODS, paper=PAPER_METHODS)
    )
    sizes = ctx.pick(smoke=(1000, 125), quick=SIZES, paper=SIZES)
    training = ctx.pick(smoke={}, quick={}, paper={"epochs": 200})
    entries = []
    for s in systems:
        n_traj = ctx.run.data.n_trajectories or DATA_SYSTEMS[s].default_trajectories
        n_train_max = int(n_traj * ctx.run.data.fractions[0])
        for n in sizes:
            n_train = min(n_train_max, n_train_for(n, n_traj, ctx.run.data.fractions[0]))
            for m in methods:
                for seed in ctx.seeds:
                    cell = ctx.cell(s, m, seed, data={"n_train": n_train}, training=training)
                    entries.append(({"system": s, "N": n, "n_train": n_train, "method": m}, cell))
    table = rmse_table(ctx, entries, KEYS)
    plot_lines(table, "N", "method", ctx.figure("sample_size"), title=SPEC.title, logx=True,
               panel="system")  # fmt: skip
    return StudyOutput({"sample_size": table})


STUDY = Study(SPEC, _body)
