"""``nllab study sample-size``: number of trajectories N ∈ {1000, …, 30} on Lotka–Volterra, all
models, 200 epochs, 3 seeds in the paper profile (paper ``Table:datascaling``).

At the paper's budget N is the whole data set, as in the paper ("the dataset trajectory size N
in total") and its reference code (``--trajectories_to_sample N``): N trajectories simulated and
split 80:10:10, so a small N has a small test split too (3 test trajectories at N = 30, whence
the paper's ± 0.3 there). The smaller profiles keep the profile's data set instead (the same
validation and test trajectories for every N) and train on ``n_train = round(0.8·N·
n_trajectories/1000)`` of its training split, so a smaller profile scales every N by the same
factor. The table reports both N and the actual ``n_train``.
"""

from __future__ import annotations

from datasets import SYSTEMS as DATA_SYSTEMS
from datasets import split_sizes
from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec, rmse_table
from flows.studies._plots import plot_lines
from flows.studies._tables import paper_rows
from tasks.config import PAPER_METHODS

SIZES = (1000, 500, 250, 125, 62, 30)
#: Table:datascaling: N -> test RMSE of the rows NODE … Neural Laplace
_PAPER = {
    1000: (0.4958, 0.4852, 0.4826, 0.8407, 0.4646, 0.1371),
    500: (0.6519, 0.6499, 0.6629, 0.9336, 0.8297, 0.2581),
    250: (0.6757, 0.6816, 0.6839, 0.9233, 0.8069, 0.3486),
    125: (0.9122, 0.9387, 0.9948, 1.1865, 1.1484, 0.5716),
    62: (0.9196, 0.8747, 0.9550, 1.0881, 0.9640, 0.7715),
    30: (0.9663, 0.9682, 0.9547, 1.0427, 0.9395, 0.9220),
}
#: Training epochs of every cell at the paper's budget ("Training for 200 epochs per dataset").
PAPER_EPOCHS = 200
SPEC = StudySpec(
    name="sample-size",
    paper=paper_rows({("lotka_volterra_dde", str(n)): row for n, row in _PAPER.items()}),
    paper_keys=("system", "N", "method"),  # (n_train is ours: how a profile splits N)
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
    training = ctx.pick(smoke={}, quick={}, paper={"epochs": PAPER_EPOCHS})
    whole_data_set = ctx.pick(smoke=False, quick=False, paper=True)
    entries = []
    for s in systems:
        fractions = ctx.run.data.fractions
        n_traj = ctx.run.data.n_trajectories or DATA_SYSTEMS[s].default_trajectories
        n_train_max = int(n_traj * fractions[0])
        for n in sizes:
            if whole_data_set:  # N trajectories in all, split as every data set is
                data = {"n_trajectories": n}
                n_train = split_sizes(n, fractions)[0]
            else:
                n_train = min(n_train_max, n_train_for(n, n_traj, fractions[0]))
                data = {"n_train": n_train}
            for m in methods:
                for seed in ctx.seeds:
                    cell = ctx.cell(s, m, seed, data=data, training=training)
                    entries.append(({"system": s, "N": n, "n_train": n_train, "method": m}, cell))
    table = rmse_table(ctx, entries, KEYS)
    plot_lines(table, "N", "method", ctx.figure("sample_size"), title=SPEC.title, logx=True,
               panel="system")  # fmt: skip
    return StudyOutput({"sample_size": table})


STUDY = Study(SPEC, _body)
