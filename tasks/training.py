"""Training loop of the paper's protocol, as a plain function (no Prefect, no MLflow).

Adam, mini-batches over trajectories, gradient-norm clipping, float64 by default, early stopping
on validation RMSE with the best-validation weights restored at the end.

One loop (:func:`_train_loop`) trains a single cell and a pack of cells
(:mod:`tasks.packing`): one stopping rule, one best-weights rule, one history. It drives a
step function (an eager module and optimiser step here, the batched step of a pack in
:mod:`tasks._packed_cells`) that keeps losses, divergence flags and clipping on the device; the
loop reads them once per epoch, with the validation. The step pieces both kinds share are in
:mod:`tasks._steps`; this module imports the packed step (a single cell on CUDA trains as a
pack of one) and :mod:`tasks.packing`, which trains several cells, imports this one.
"""

from __future__ import annotations

import copy
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from nlmodels import ForecastModel
from nlmodels.model_registry import INIT_LOCK
from tasks._packed_cells import pack_of_one, prefers_one_by_one
from tasks._steps import (
    DTYPES,
    Flags,
    Readout,
    Tensors,
    predict_tensors,
    read_epoch,
    record_step,
    validate,
)
from tasks.config import TrainConfig
from tasks.errors import Interrupted

__all__ = [
    "EpochRecord",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "epoch_bar",
    "predict",
    "seeded",
    "select_device",
    "train",
]

# torch's CPU generator is process-global: seeding and drawing initial weights must not interleave
# with any other model's initialisation (every build_model takes this lock), or the same seed
# would give different models. Training draws from generators of its own (shuffles, samples).
_RNG_LOCK = INIT_LOCK


class TrainingDiverged(RuntimeError):
    """The loss or the gradients became NaN or infinite."""


class TrainingInterrupted(Interrupted):
    """Training was asked to stop (Ctrl-C or a cancelled flow) before it finished."""


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
    stopped: Literal["epochs", "early_stopping", "time_budget"]
    seconds: float
    #: cells trained together in one batched model (:func:`tasks.packing.train_packed`)
    packed_members: int = 1
    #: whether the training steps were replayed from a captured CUDA graph
    graphs: bool = False


def _loss_diverged(label: str, loss: float, epoch: int, batch: int) -> TrainingDiverged:
    return TrainingDiverged(
        f"{label}: training loss is {loss} at epoch {epoch}, batch {batch}; "
        "the model diverged (try a smaller learning rate)"
    )


def _norm_diverged(label: str, norm: float, epoch: int, batch: int) -> TrainingDiverged:
    return TrainingDiverged(f"{label}: gradient norm is {norm} at epoch {epoch}, batch {batch}")


def _val_diverged(label: str, val_rmse: float, epoch: int) -> TrainingDiverged:
    return TrainingDiverged(f"{label}: validation RMSE is {val_rmse} at epoch {epoch}")


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch, numpy and random while holding the process-wide RNG lock, with torch's
    default dtype at its own default (float32: initial weights are drawn in it, and a process
    that changed it would draw other weights from the same seed)."""
    with _RNG_LOCK:
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)  # noqa: NPY002 - third-party code may draw from it
            random.seed(seed)
            yield
        finally:
            torch.set_default_dtype(default)


def select_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` (an error if CUDA is absent) or ``auto`` (CUDA when available)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "device 'cuda' was requested but CUDA is not available "
                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
                "use --device cpu or --device auto, or install a CUDA build of torch"
            )
        return torch.device("cuda")
    raise ValueError(f"unknown device {name!r}; valid devices: auto, cpu, cuda")


def predict(
    model: ForecastModel,
    split,
    *,
    device: torch.device | None = None,
    dtype: str = "float64",
    batch_size: int = 128,
) -> np.ndarray:
    """Predict a split's query points (normalised scale), as numpy ``[n, T_q, D]``."""
    device = device or next(model.parameters()).device
    data = Tensors.of(split, device, DTYPES[dtype])
    return predict_tensors(model, data, batch_size).cpu().numpy()


def epoch_bar(config: TrainConfig, label: str, progress: bool, budget: float | None = None):
    """The epochs of a training run as a tqdm bar. Under a time budget (``budget`` seconds,
    default ``config.max_train_seconds``) the epoch ceiling is not where the run ends, so the
    bar counts epochs and names the budget instead of showing an ETA to the ceiling."""
    budget = config.max_train_seconds if budget is None else budget
    epochs: Iterable[int] = range(config.epochs)
    if budget is not None:
        epochs, label = iter(epochs), f"{label} (budget {budget:.0f} s)"
    return tqdm(epochs, desc=label, disable=not progress, leave=True, unit="ep")


class _EagerCell:
    """The step function of one cell: its module, ``torch.optim.Adam`` and
    ``clip_grad_norm_``, eagerly (any model, e.g. Neural Laplace's native kernels on the CPU).
    A step whose loss or gradient norm is not finite is not applied (its weights stay as they
    were, as the pack's masks keep a diverged member's), and the cell is reported diverged at
    the end of the epoch."""

    graphs_used = False

    def __init__(self, model, train_data, val_data, config: TrainConfig, seed: int, device):
        self.model, self.train_data, self.val_data = model, train_data, val_data
        self.config = config
        self.members = [0]
        self.params = list(model.parameters())
        self.optimiser = torch.optim.Adam(self.params, lr=config.lr)
        # A private generator: the shuffling order depends on this cell's seed only.
        self.gen = torch.Generator().manual_seed(seed)
        self.flags = Flags.zeros((), torch.device(device))
        self.device = device
        self.order = torch.empty(0)

    def begin_epoch(self) -> None:
        self.model.train()
        self.model.reset_nfe()
        self.order = torch.randperm(len(self.train_data), generator=self.gen).to(self.device)
        self.flags.total.zero_()

    def train_step(self, b_i: int, start: int, batch: int) -> None:
        model, clip = self.model, self.config.grad_clip
        b = self.train_data.batch(self.order[start : start + batch])
        self.optimiser.zero_grad(set_to_none=True)
        loss = model.training_loss(b.obs_t, b.obs_x, b.query_t, b.target)
        loss.backward()
        norm = None
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        with torch.no_grad():
            ok = record_step(self.flags, loss, norm, b_i, batch)
            before = [p.detach().clone() for p in self.params]
        self.optimiser.step()
        with torch.no_grad():
            for p, old in zip(self.params, before, strict=True):
                p.copy_(torch.where(ok, p, old))

    def end_epoch(self) -> Readout:
        nfe = self.model.nfe
        val_loss, val_rmse = validate(self.model, self.val_data, self.config.batch_size)
        return read_epoch(self.flags, val_loss, val_rmse, nfe)

    def keep_best(self, j: int) -> dict:
        return copy.deepcopy(self.model.state_dict())

    def diverged(self, j: int) -> None:  # left as at its divergence, in training mode
        self.model.train()

    def finish(self, j: int, best_state: dict, nfe: int) -> None:
        self.model.load_state_dict(best_state)
        self.model.eval()

    def drop(self, keep: list[int]) -> None:
        self.members = [self.members[j] for j in keep]


@dataclass
class _Progress:
    best_rmse: float = math.inf
    best_epoch: int = -1
    best_state: dict | None = None
    history: list[EpochRecord] = field(default_factory=list)
    result: TrainResult | TrainingDiverged | None = None


def _train_loop(
    cells,
    n_train: int,
    config: TrainConfig,
    labels: list[str],
    *,
    initial_states: list[dict],
    on_epoch: Callable[[int, EpochRecord], None] | None,
    stop: threading.Event | None,
    progress: bool,
    budget: float | None,
) -> list[TrainResult | TrainingDiverged]:
    """Train ``cells`` (a step function over one or several cells; see :class:`_EagerCell` and
    :class:`tasks._packed_cells.PackedCells`) for up to ``config.epochs`` epochs of ``n_train``
    trajectories in batches of ``config.batch_size``.

    Per cell: early stopping on validation RMSE (``patience``), the best-validation weights
    restored at its end, a divergence (non-finite loss, gradient norm or validation RMSE) that
    ends that cell only, and ``on_epoch(i, record)`` after each of cell ``i``'s epochs. The
    wall-clock ``budget`` (seconds) ends every cell still training. Setting ``stop`` raises
    :class:`TrainingInterrupted`. Per-step values stay on the device: the loop reads them, and
    the validation, once per epoch (:meth:`end_epoch`).
    """
    n_cells = len(labels)
    cells_progress = [_Progress(best_state=s) for s in initial_states]
    bs = config.batch_size
    t_start = time.perf_counter()
    label = labels[0] if n_cells == 1 else f"{labels[0]} (+{n_cells - 1})"
    bar = epoch_bar(config, label, progress, budget)
    for epoch in bar:
        t0 = time.perf_counter()
        cells.begin_epoch()
        for b_i, start in enumerate(range(0, n_train, bs)):
            if stop is not None and stop.is_set():
                # every member named: each member's KILLED run carries this message
                names = ", ".join(labels[m] for m in cells.members)
                raise TrainingInterrupted(f"{names}: stopped at epoch {epoch}")
            cells.train_step(b_i, start, min(bs, n_train - start))
        out = cells.end_epoch()
        seconds = time.perf_counter() - t0
        keep = []
        for j, m in enumerate(cells.members):
            cell, lab = cells_progress[m], labels[m]
            if not out.active[j]:
                make = _loss_diverged if out.div_kind[j] == 1 else _norm_diverged
                cell.result = make(lab, out.div_value[j], epoch, out.div_batch[j])
                cells.diverged(j)
                continue
            val_rmse = out.val_rmse[j]
            if not math.isfinite(val_rmse):
                cell.result = _val_diverged(lab, val_rmse, epoch)
                cells.diverged(j)
                continue
            record = EpochRecord(
                epoch, out.totals[j] / n_train, out.val_loss[j], val_rmse, seconds, out.nfe[j]
            )
            cell.history.append(record)
            if val_rmse < cell.best_rmse:
                cell.best_rmse, cell.best_epoch = val_rmse, epoch
                cell.best_state = cells.keep_best(j)
            if n_cells == 1:
                bar.set_postfix(loss=f"{record.train_loss:.4g}", val_rmse=f"{val_rmse:.4g}")
            if on_epoch is not None:
                on_epoch(m, record)
            stopped: Literal["epochs", "early_stopping", "time_budget"] | None = None
            if config.patience is not None and epoch - cell.best_epoch >= config.patience:
                stopped = "early_stopping"
            elif budget is not None and time.perf_counter() - t_start >= budget:
                stopped = "time_budget"
            elif epoch == config.epochs - 1:
                stopped = "epochs"
            if stopped is None:
                keep.append(j)
                continue
            cells.finish(j, cell.best_state, out.nfe[j])
            cell.result = TrainResult(
                tuple(cell.history),
                cell.best_epoch,
                cell.best_rmse,
                stopped,
                time.perf_counter() - t_start,
                packed_members=n_cells,
                graphs=cells.graphs_used,
            )
        if n_cells > 1:
            bar.set_postfix(members=len(keep))
        if not keep:
            break
        if len(keep) < len(cells.members):
            cells.drop(keep)
    bar.close()
    return [c.result for c in cells_progress]  # type: ignore[misc]


def train(
    model: ForecastModel,
    train_split,
    val_split,
    config: TrainConfig,
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    stop: threading.Event | None = None,
    progress: bool = False,
    label: str = "train",
    step: Literal["auto", "eager", "packed"] = "auto",
) -> TrainResult:
    """Train ``model`` in place on ``train_split``; early-stop on ``val_split`` RMSE.

    Splits are ``datasets.SplitData`` (numpy, normalised). On return the model holds the weights
    of its best validation epoch. ``on_epoch`` is called after every epoch (e.g. to log metrics);
    setting ``stop`` ends training with :class:`TrainingInterrupted`. A NaN or infinite loss or
    gradient raises :class:`TrainingDiverged` (at the end of the epoch in which it happened; the
    model keeps the weights it had before that step).

    ``step``: ``auto`` trains a model that :func:`tasks.packing.packable` accepts as a pack of
    one wherever it would be packed with others (on CUDA, its step captured into a CUDA graph;
    on the CPU, all but :func:`~tasks.packing.prefers_one_by_one`'s models), so that a cell's
    bytes do not depend on whether it trained alone or packed: the pack's batched kernels,
    clipping and Adam round differently from the module's own kernels and
    ``torch.optim.Adam`` (by an ulp per step), and training amplifies that into a different
    model (NODE, stiff Van der Pol, quick profile: test RMSE 0.402 packed, 0.454 eagerly).
    Elsewhere it steps the module and ``torch.optim.Adam`` eagerly; ``eager`` always does the
    latter; ``packed`` always trains a pack of one (an error where the model or its splits
    cannot be packed).
    """
    if step not in ("auto", "eager", "packed"):
        raise ValueError(f"unknown step {step!r}; valid: auto, eager, packed")
    device = torch.device(device)
    dtype = DTYPES[config.dtype]
    model.to(device=device, dtype=dtype)
    train_data = Tensors.of(train_split, device, dtype)
    val_data = Tensors.of(val_split, device, dtype)
    if len(train_data) == 0 or len(val_data) == 0:
        raise ValueError(
            f"training needs trajectories in both splits (train {len(train_data)}, "
            f"val {len(val_data)}); increase n_trajectories"
        )
    cells = None
    if step == "packed" or (step == "auto" and not prefers_one_by_one(model, device)):
        cells = pack_of_one(model, train_split, val_split, config, device, seed, label)
        if cells is None and step == "packed":
            raise ValueError(f"{label}: {type(model).__name__} cannot train as a pack of one")
    if cells is None:
        cells = _EagerCell(model, train_data, val_data, config, seed, device)
    callback = None if on_epoch is None else (lambda _i, r: on_epoch(r))
    (result,) = _train_loop(
        cells,
        len(train_data),
        config,
        [label],
        initial_states=[copy.deepcopy(model.state_dict())],
        on_epoch=callback,
        stop=stop,
        progress=progress,
        budget=config.max_train_seconds,
    )
    if isinstance(result, TrainingDiverged):
        raise result
    return result
