"""The operators one training step dispatches, counted on the CPU twin: what a step captured into
a CUDA graph replays (one kernel each), and what an eager step launches.

A GPU replays a captured step's kernels without the host launching them one by one; for the
small models of the paper's table each kernel is tiny, so a step's time on the GPU follows its
kernel count rather than its arithmetic. The projections of steps no GPU has timed yet
(``benchmarks/latent_ode_steps.py --project``) scale a timed step by the ratio of the two steps'
counts. They are counted here, on the CPU, as the operators torch dispatches to kernels (a
``TorchDispatchMode``: below ``vmap`` and autograd, so a batched operator over a pack counts
once, and the backward's operators count too) during one step of a batch of 128 trajectories
of the throughput table's data (``benchmarks/throughput.py``: 2 dimensions, 100 observed and
100 predicted points, float64).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nlmodels import ForecastModel
from nltrain import StepFunction

__all__ = ["BATCH", "epoch_operators", "step_operators"]

#: Trajectories of the counted batch (the paper profile's batch size).
BATCH = 128


class _Count(TorchDispatchMode):
    """Counts the operators dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _cells(
    build: Callable[[int], ForecastModel],
    members: int,
    packed: bool,
    prepare: Callable[[Sequence[ForecastModel]], None] | None,
    n_train: int,
) -> StepFunction:
    from benchmarks.throughput import N_VAL, splits
    from nltrain import TrainConfig, step_function
    from nltrain._packed_cells import PackedCells

    if not packed and members != 1:
        raise ValueError("an eager step trains one model")
    tr, va = splits(n_train, N_VAL)
    cfg = TrainConfig(epochs=1, patience=None, batch_size=BATCH, dtype="float64")
    models = [build(seed).double() for seed in range(members)]
    if prepare is not None:
        prepare(models)
    cpu = torch.device("cpu")
    if not packed:
        return step_function(models[0], tr, va, cfg, device=cpu, step="eager")
    return PackedCells(
        models, [tr] * members, [va] * members, cfg, cpu, list(range(members)),
        [str(i) for i in range(members)], False,
    )  # fmt: skip


def step_operators(
    build: Callable[[int], ForecastModel],
    *,
    members: int = 1,
    packed: bool = True,
    prepare: Callable[[Sequence[ForecastModel]], None] | None = None,
) -> tuple[int, StepFunction]:
    """(operators, the step function) of one training step (forward, backward, clipping,
    Adam) of ``members`` models ``build(seed)`` in float64 on the CPU: one pack of them
    (``nltrain._packed_cells.PackedCells``, its batched step, as a CUDA graph captures it), or,
    with ``packed=False``, the eager step of one (``nltrain.step_function``: the module and
    ``torch.optim.Adam``). ``prepare(models)`` runs before the step (e.g. a solver's budget)."""
    cells = _cells(build, members, packed, prepare, BATCH)
    cells.begin_epoch()
    with _Count() as count:
        cells.train_step(0, 0, BATCH)
    return count.n, cells


def epoch_operators(
    build: Callable[[int], ForecastModel], *, members: int = 1, packed: bool = True
) -> int:
    """The operators of a whole epoch (as :func:`step_operators`) on the throughput table's
    800 training trajectories (its batches, the last one short) and 100 validation ones: what
    a timed cell-epoch runs."""
    from benchmarks.throughput import N_TRAIN

    cells = _cells(build, members, packed, None, N_TRAIN)
    with _Count() as count:
        cells.begin_epoch()
        for b_i, start in enumerate(range(0, N_TRAIN, BATCH)):
            cells.train_step(b_i, start, min(BATCH, N_TRAIN - start))
        cells.end_epoch()
    return count.n
