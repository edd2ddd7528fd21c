"""The one training loop (paper protocol: mini-batches over trajectories, early stopping on
validation RMSE, the best-validation weights restored at the end), over a declared step function.
A step function whose models select on their own objective (``selection_metric = "val_loss"``:
the reference code's Latent ODE keeps its best validation ELBO) is watched on that instead.

:func:`train_loop` drives any :class:`StepFunction`: one cell's eager module and optimiser
step (:func:`nltrain.train`) or the batched step of a pack
(:class:`nltrain._packed_cells.PackedCells`, :func:`nltrain.train_packed`). Per-step values
stay on the device; the loop reads them, and the validation, once per epoch. When a cell stops
is :func:`stop_reason`'s answer alone, a pure function of its history.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import astuple, dataclass, field
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from tqdm.auto import tqdm

from nltrain._checkpoints import Checkpoints
from nltrain._config import TrainConfig
from nltrain._errors import TrainingDiverged, TrainingInterrupted
from nltrain._steps import Readout

__all__ = [
    "EpochRecord",
    "LoopOptions",
    "Resumable",
    "SelectionMetric",
    "StepFunction",
    "StopReason",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "epoch_bar",
    "selection_metric",
    "stop_reason",
    "train_loop",
]

#: Why a cell stopped training: its epoch ceiling, early stopping, or the wall-clock budget.
StopReason = Literal["epochs", "early_stopping", "time_budget"]
#: The validation score that picks the weights kept (:attr:`EpochRecord` field names).
SelectionMetric = Literal["val_rmse", "val_loss"]


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    train_loss: float
    val_loss: float
    val_rmse: float
    seconds: float
    nfe: int


@dataclass(frozen=True)
class TrainResult:
    history: tuple[EpochRecord, ...]
    best_epoch: int
    best_val_rmse: float
    stopped: StopReason
    seconds: float
    #: cells trained together in one batched model (:func:`nltrain.train_packed`)
    packed_members: int = 1
    #: whether the training steps were replayed from a captured CUDA graph
    graphs: bool = False
    #: the process's CPU seconds over the same span as ``seconds`` (``time.process_time``: with
    #: one torch thread, the wall time less what other work on the machine took from the run);
    #: None where a checkpoint it resumed from did not keep them
    cpu_seconds: float | None = None


@runtime_checkable
class StepFunction(Protocol):
    """What :func:`train_loop` drives: one or several cells (``members``: the positions, among
    the loop's labels, of those still training; ``j`` below indexes that list)."""

    #: whether a step was replayed from a captured CUDA graph
    graphs_used: bool
    #: training trajectories per cell (each epoch steps over them in batches)
    n_train: int

    @property
    def members(self) -> list[int]: ...

    def begin_epoch(self) -> None:
        """Training mode, a fresh shuffle per cell, the epoch's sums and NFE counts zeroed."""

    def train_step(self, b_i: int, start: int, batch: int) -> None:
        """Batch ``b_i``: rows ``start:start + batch`` of each cell's shuffle (device only)."""

    def end_epoch(self) -> Readout:
        """The validation and the epoch's flags, read to the host once."""

    def keep_best(self, j: int) -> dict:
        """A copy of member ``j``'s weights (its new best validation epoch)."""

    def diverged(self, j: int) -> None:
        """Member ``j`` diverged: leave its module as it was at that moment."""

    def finish(self, j: int, best_state: dict, nfe: int) -> None:
        """Member ``j`` stopped: its module gets ``best_state``, in eval mode."""

    def drop(self, keep: list[int]) -> None:
        """Train only the members at positions ``keep`` from now on."""


@runtime_checkable
class Resumable(StepFunction, Protocol):
    """A step function whose state can be checkpointed between epochs (see
    :class:`~nltrain.Checkpoints`): the loop's checkpoints need it, and skip a step without."""

    def state(self) -> dict:
        """Everything the rest of training reads: weights, optimiser, every random stream
        (tensors, numbers and strings only)."""

    def restore(self, state: dict) -> None:
        """Put back :meth:`state` into a step built as the saved one was, its stopped cells
        dropped as they were."""


@dataclass(frozen=True)
class LoopOptions:
    """How :func:`train_loop` runs, besides the protocol (:class:`~nltrain.TrainConfig`).

    ``labels``: one per cell (error messages, the bar); ``on_epoch(i, record)`` after each of
    cell ``i``'s epochs; setting ``stop`` raises :class:`TrainingInterrupted`; ``budget``: the
    wall-clock seconds of the whole run (None: ``config.max_train_seconds``); ``checkpoints``:
    where the run keeps its checkpoints and resumes from them (:class:`~nltrain.Checkpoints`;
    None: none), for a :class:`Resumable` step whose labels it covers; ``on_resume(i, epoch)``
    when cell ``i`` resumed from one, ``epoch`` the first it trains now (its epochs before are
    the checkpoint's, passed to ``on_epoch`` again).
    """

    labels: tuple[str, ...] = ("train",)
    on_epoch: Callable[[int, EpochRecord], None] | None = None
    stop: threading.Event | None = None
    progress: bool = False
    budget: float | None = None
    checkpoints: Checkpoints | None = None
    on_resume: Callable[[int, int], None] | None = None


def epoch_bar(
    config: TrainConfig,
    label: str,
    progress: bool,
    budget: float | None = None,
    start: int = 0,
):
    """The epochs of a training run from ``start`` (a resumed run's first) as a tqdm bar.
    Under a time budget (``budget`` seconds, default ``config.max_train_seconds``) the epoch
    ceiling is not where the run ends, so the bar counts epochs and names the budget instead of
    showing an ETA to the ceiling."""
    budget = config.max_train_seconds if budget is None else budget
    epochs: Iterable[int] = range(start, config.epochs)
    total: int | None = config.epochs
    if budget is not None:
        epochs, label, total = iter(epochs), f"{label} (budget {budget:.0f} s)", None
    return tqdm(
        epochs, desc=label, disable=not progress, leave=True, unit="ep", initial=start, total=total
    )


def _best(history: Sequence[EpochRecord], metric: SelectionMetric = "val_rmse") -> EpochRecord:
    """The first epoch of the lowest validation ``metric`` (later ties do not replace it)."""
    return min(history, key=lambda r: getattr(r, metric))


def selection_metric(step: object) -> SelectionMetric:
    """What ``step``'s cells are selected on: its ``selection_metric`` (the models'), else the
    validation RMSE (a step function that does not say)."""
    metric = getattr(step, "selection_metric", "val_rmse")
    if metric == "val_loss":
        return "val_loss"
    if metric == "val_rmse":
        return "val_rmse"
    raise ValueError(f"selection_metric must be 'val_rmse' or 'val_loss', got {metric!r}")


def stop_reason(
    history: Sequence[EpochRecord],
    config: TrainConfig,
    *,
    elapsed: float = 0.0,
    budget: float | None = None,
    metric: SelectionMetric = "val_rmse",
) -> StopReason | None:
    """Whether a cell whose epochs so far are ``history`` stops now, and why (None: it trains
    on). In order: ``early_stopping`` (``config.patience`` epochs since its best validation
    ``metric``), ``time_budget`` (``elapsed`` seconds reached ``budget``, default
    ``config.max_train_seconds``), ``epochs`` (its last epoch was ``config.epochs - 1``)."""
    if not history:
        return None
    epoch = history[-1].epoch
    budget = config.max_train_seconds if budget is None else budget
    if config.patience is not None and epoch - _best(history, metric).epoch >= config.patience:
        return "early_stopping"
    if budget is not None and elapsed >= budget:
        return "time_budget"
    if epoch == config.epochs - 1:
        return "epochs"
    return None


def _loss_diverged(label: str, loss: float, epoch: int, batch: int) -> TrainingDiverged:
    return TrainingDiverged(
        f"{label}: training loss is {loss} at epoch {epoch}, batch {batch}; "
        "the model diverged (try a smaller learning rate)"
    )


def _norm_diverged(label: str, norm: float, epoch: int, batch: int) -> TrainingDiverged:
    return TrainingDiverged(f"{label}: gradient norm is {norm} at epoch {epoch}, batch {batch}")


@dataclass
class _Cell:
    """One cell's state in the loop: its history, best weights and, once stopped, result."""

    history: list[EpochRecord] = field(default_factory=list)
    best_score: float = math.inf
    best_state: dict | None = None
    result: TrainResult | TrainingDiverged | None = None


class _Spent(NamedTuple):
    """Seconds a run has spent: wall-clock, and its process's CPU time (None: not known, for a
    run resumed from a checkpoint that did not keep it)."""

    wall: float = 0.0
    cpu: float | None = 0.0


class _Clock:
    """A run's :class:`_Spent`, counting on from what a checkpoint had spent. The CPU time is
    the process's (``time.process_time``, every thread's): with one torch thread it is the
    wall time less what other work on the machine took from the run, a time that does not
    depend on the load; with several it exceeds the wall time."""

    def __init__(self, spent: _Spent) -> None:
        self.wall0 = time.perf_counter() - spent.wall
        self.cpu0 = None if spent.cpu is None else time.process_time() - spent.cpu

    def wall(self) -> float:
        return time.perf_counter() - self.wall0

    def read(self) -> _Spent:
        cpu = None if self.cpu0 is None else time.process_time() - self.cpu0
        return _Spent(self.wall(), cpu)


def train_loop(
    step: StepFunction, config: TrainConfig, options: LoopOptions = LoopOptions()
) -> list[TrainResult | TrainingDiverged]:
    """Train ``step``'s cells (one per label) for up to ``config.epochs`` epochs of
    ``step.n_train`` trajectories in batches of ``config.batch_size``; per cell its
    :class:`TrainResult`, or the :class:`TrainingDiverged` that ended it (a non-finite loss,
    gradient norm or validation RMSE ends that cell only, at the end of its epoch).

    With ``options.checkpoints`` (and a :class:`Resumable` step), a run first resumes from its
    checkpoint (each restored epoch passed to ``on_epoch`` again, so that a new log holds the
    whole curve), and keeps one while it trains and once it has finished: the same results and
    bytes as a run never interrupted (:mod:`nltrain._checkpoints`)."""
    labels, n = options.labels, len(options.labels)
    metric = selection_metric(step)
    cells = [_Cell() for _ in labels]
    budget = config.max_train_seconds if options.budget is None else options.budget
    keeper = _Keeper.of(step, options)
    start, spent = (0, _Spent()) if keeper is None else keeper.resume(cells, options)
    if all(c.result is not None for c in cells):  # finished before: its results, kept
        return [c.result for c in cells]  # type: ignore[misc]
    clock = _Clock(spent)
    label = labels[0] if n == 1 else f"{labels[0]} (+{n - 1})"
    bar = epoch_bar(config, label, options.progress, budget, start)
    for epoch in bar:
        t0 = time.perf_counter()
        _train_epoch(step, config.batch_size, epoch, options, keeper)
        out = step.end_epoch()
        seconds = time.perf_counter() - t0
        keep = []
        for j, m in enumerate(step.members):
            record = _settle(step, cells[m], j, out, epoch, seconds, labels[m], metric)
            if record is None:
                continue
            if n == 1:
                bar.set_postfix(loss=f"{record.train_loss:.4g}", val_rmse=f"{record.val_rmse:.4g}")
            if options.on_epoch is not None:
                options.on_epoch(m, record)
            stopped = stop_reason(
                cells[m].history, config, elapsed=clock.wall(), budget=budget, metric=metric
            )
            if stopped is None:
                keep.append(j)
                continue
            step.finish(j, cells[m].best_state, out.nfe[j])  # type: ignore[arg-type]
            cells[m].result = _result(cells[m], stopped, clock.read(), n, step, metric)
        if n > 1:
            bar.set_postfix(members=len(keep))
        if not keep:
            break
        if len(keep) < len(step.members):
            step.drop(keep)
        if keeper is not None:
            keeper.running(epoch, clock.read(), cells)
    bar.close()
    if keeper is not None:
        keeper.finished(clock.read(), cells)
    return [c.result for c in cells]  # type: ignore[misc]


class _Keeper:
    """A loop's checkpoints (:class:`~nltrain.Checkpoints`): what is saved, when, and how it
    is put back."""

    def __init__(self, store: Checkpoints, step: Resumable, labels: tuple[str, ...]) -> None:
        self.store, self.step, self.labels = store, step, labels
        self.last = time.monotonic()
        #: the state after the last whole epoch, until it is saved
        self.pending: dict | None = None

    @classmethod
    def of(cls, step: StepFunction, options: LoopOptions) -> _Keeper | None:
        store = options.checkpoints
        if store is None or not isinstance(step, Resumable) or not store.covers(options.labels):
            return None
        return cls(store, step, options.labels)

    def running(self, epoch: int, elapsed: _Spent, cells: list[_Cell]) -> None:
        """After ``epoch`` (the cells that stopped dropped from the step, their results in
        ``cells``): its state kept (a copy: the step trains on), and saved if ``every_seconds``
        have passed, else when the run is interrupted."""
        self.pending = {
            "finished": False,
            "epoch": epoch,
            "seconds": elapsed.wall,
            "cpu_seconds": elapsed.cpu,
            "step": copy.deepcopy(self.step.state()),
            "cells": [_cell_state(c) for c in cells],
        }
        if time.monotonic() - self.last >= self.store.every_seconds:
            self.flush()

    def flush(self) -> None:
        """Save the state kept after the last whole epoch, if not saved yet."""
        if self.pending is not None:
            self.store.save(self.labels, self.pending)
            self.pending, self.last = None, time.monotonic()

    def finished(self, elapsed: _Spent, cells: list[_Cell]) -> None:
        """Every cell's result and best weights, until the caller has kept them."""
        state = {
            "finished": True,
            "seconds": elapsed.wall,
            "cpu_seconds": elapsed.cpu,
            "cells": [_cell_state(c) for c in cells],
        }
        self.store.save(self.labels, state)

    def resume(self, cells: list[_Cell], options: LoopOptions) -> tuple[int, _Spent]:
        """The run's checkpoint, if any, put back into ``step`` and ``cells`` (each restored
        epoch passed to ``on_epoch``); the epoch to start at and the seconds already spent."""
        saved = self.store.load(self.labels)
        if saved is None:
            return 0, _Spent()
        for m, (cell, kept) in enumerate(zip(cells, saved["cells"], strict=True)):
            cell.history = [EpochRecord(*r) for r in kept["history"]]
            cell.best_score, cell.best_state = kept["best_score"], kept["best_state"]
            if options.on_epoch is not None:
                for record in cell.history:
                    options.on_epoch(m, record)
        if options.on_resume is not None:
            for m, cell in enumerate(cells):
                options.on_resume(m, len(cell.history))
        live = []  # the cells the checkpoint had training; the others get their results back
        for j, (cell, kept) in enumerate(zip(cells, saved["cells"], strict=True)):
            if kept["result"] is None:
                live.append(j)
                continue
            cell.result = _result_of(kept["result"], cell)
            if isinstance(cell.result, TrainResult) and cell.best_state is not None:
                self.step.finish(j, cell.best_state, cell.history[-1].nfe)
        # (a checkpoint written before the CPU seconds were kept: they are unknown)
        spent = _Spent(saved["seconds"], saved.get("cpu_seconds"))
        if saved["finished"]:
            return 0, spent
        if len(live) < len(cells):
            self.step.drop(live)
        self.step.restore(saved["step"])
        return saved["epoch"] + 1, spent


def _cell_state(cell: _Cell) -> dict:
    result: dict | None
    if cell.result is None:
        result = None
    elif isinstance(cell.result, TrainingDiverged):
        result = {"diverged": str(cell.result)}
    else:
        r = cell.result
        result = {
            "best_epoch": r.best_epoch,
            "best_val_rmse": r.best_val_rmse,
            "stopped": r.stopped,
            "seconds": r.seconds,
            "packed_members": r.packed_members,
            "graphs": r.graphs,
            "cpu_seconds": r.cpu_seconds,
        }
    return {
        "history": [list(astuple(r)) for r in cell.history],
        "best_score": cell.best_score,
        "best_state": cell.best_state,
        "result": result,
    }


def _result_of(kept: dict, cell: _Cell) -> TrainResult | TrainingDiverged:
    if "diverged" in kept:
        return TrainingDiverged(kept["diverged"])
    return TrainResult(history=tuple(cell.history), **kept)


def _result(
    cell: _Cell,
    stopped: StopReason,
    spent: _Spent,
    n: int,
    step: StepFunction,
    metric: SelectionMetric,
) -> TrainResult:
    best = _best(cell.history, metric)
    return TrainResult(
        tuple(cell.history),
        best.epoch,
        best.val_rmse,
        stopped,
        spent.wall,
        n,
        step.graphs_used,
        spent.cpu,
    )


def _train_epoch(
    step: StepFunction, bs: int, epoch: int, options: LoopOptions, keeper: _Keeper | None
) -> None:
    """One epoch's training steps (no host read); raises :class:`TrainingInterrupted` as soon
    as ``options.stop`` is set, the last whole epoch's state saved first (``keeper``)."""
    step.begin_epoch()
    n_train = step.n_train
    for b_i, start in enumerate(range(0, n_train, bs)):
        if options.stop is not None and options.stop.is_set():
            # every member named: each member's KILLED run carries this message
            names = ", ".join(options.labels[m] for m in step.members)
            if keeper is not None:
                keeper.flush()
            raise TrainingInterrupted(f"{names}: stopped at epoch {epoch}")
        step.train_step(b_i, start, min(bs, n_train - start))


def _settle(
    step: StepFunction,
    cell: _Cell,
    j: int,
    out: Readout,
    epoch: int,
    seconds: float,
    label: str,
    metric: SelectionMetric,
) -> EpochRecord | None:
    """Member ``j``'s epoch: its record (kept, and its weights if they are its best so far), or
    None after recording its divergence as its result."""
    if not out.active[j]:
        make = _loss_diverged if out.div_kind[j] == 1 else _norm_diverged
        cell.result = make(label, out.div_value[j], epoch, out.div_batch[j])
    elif not math.isfinite(val_rmse := out.val_rmse[j]):
        cell.result = TrainingDiverged(f"{label}: validation RMSE is {val_rmse} at epoch {epoch}")
    elif metric == "val_loss" and not math.isfinite(val_loss := out.val_loss[j]):
        cell.result = TrainingDiverged(f"{label}: validation loss is {val_loss} at epoch {epoch}")
    else:
        train_loss = out.totals[j] / step.n_train
        record = EpochRecord(epoch, train_loss, out.val_loss[j], val_rmse, seconds, out.nfe[j])
        cell.history.append(record)
        score = getattr(record, metric)
        if score < cell.best_score:
            cell.best_score, cell.best_state = score, step.keep_best(j)
        return record
    step.diverged(j)
    return None
