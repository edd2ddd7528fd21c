"""Training of the paper's protocol for one cell, as a plain function (no Prefect, no MLflow).

Adam, mini-batches over trajectories, gradient-norm clipping, float64 by default, early stopping
on validation RMSE with the best-validation weights restored at the end.

:func:`train` builds a cell's step function (:class:`_EagerCell` here: the module and
``torch.optim.Adam`` eagerly; or a pack of one, :mod:`nltrain._packed_cells`) and runs it through
:func:`nltrain.train_loop`, the one loop, which also trains packs (:mod:`nltrain._packing`).
Its results and errors are re-exported here. :func:`epoch_seconds` times that same path.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import platform
import random
import statistics
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch

from datasets import SplitData
from nlmodels import ForecastModel, require_numerics
from nlmodels.model_registry import INIT_LOCK
from nltrain._checkpoints import Checkpoints, generator_states, restore_generators
from nltrain._config import TrainConfig
from nltrain._loop import (
    EpochRecord,
    LoopOptions,
    StepFunction,
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    epoch_bar,
    train_loop,
)
from nltrain._packed_cells import pack_of_one, prefers_one_by_one
from nltrain._steps import (
    DTYPES,
    Flags,
    Readout,
    Tensors,
    predict_tensors,
    read_epoch,
    record_step,
    validate,
)

__all__ = [
    # the loop's results and errors (nltrain._loop), where callers of train() look for them
    "EpochRecord",
    "TrainResult",
    "TrainingDiverged",
    "TrainingInterrupted",
    "epoch_bar",
    "epoch_seconds",
    "predict",
    "seeded",
    "select_device",
    "step_function",
    "train",
]

# torch's CPU generator is process-global: seeding and drawing initial weights must not interleave
# with any other model's initialisation (every build_model takes this lock), or the same seed
# would give different models. Training draws from generators of its own (shuffles, samples).
_RNG_LOCK = INIT_LOCK


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Draw a model's initial weights from ``seed``: torch's generator seeded while holding the
    process-wide RNG lock, with torch's default dtype at its own default (float32: initial
    weights are drawn in it, and a process that changed it would draw other weights from the
    same seed).

    Python's ``random`` and numpy's legacy global generator are seeded for the block too (a
    plugin's constructor may draw from them) and put back as they were on exit: other code in
    the process reads them (Prefect draws its temporary server's port from ``random``), and a
    command that left them seeded made every process draw the same numbers. Nothing of the
    project draws from them. Torch's generator is left seeded, as ``torch.manual_seed`` leaves
    it: only torch code reads it, and the project seeds it under the lock before each draw that
    matters (a model's weights here; the canaries' training in
    :mod:`nltrain.numerics._fingerprints`), so what it holds after a block changes no result."""
    with _RNG_LOCK:
        default = torch.get_default_dtype()
        python_state, numpy_state = random.getstate(), np.random.get_state()  # noqa: NPY002
        torch.set_default_dtype(torch.float32)
        try:
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)  # noqa: NPY002 - restored below
            random.seed(seed)
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)  # noqa: NPY002
            torch.set_default_dtype(default)


@functools.cache  # once per process (threads racing to it set the same values twice)
def _keep_freed_memory() -> None:
    """Have glibc's allocator keep the memory a training step frees for the next step's tensors
    (once per process; nothing where the C library is not glibc).

    A CPU step allocates and frees the same large tensors batch after batch (Neural Laplace's
    decoder: some 50 MB). By default glibc maps blocks above a threshold (which adapts, up to
    32 MiB) afresh, and gives the heap's top back to the system once more than twice that
    threshold lies free there (``mallopt(3)``: ``M_MMAP_THRESHOLD``, ``M_TRIM_THRESHOLD``),
    which happens after every step: the next step's tensors then start on fresh pages, each
    page a fault the kernel zeroes (``perf``, Neural Laplace at the paper's sizes: some 8 % of
    an epoch in the kernel, nearly all of it page faults). With the threshold fixed at 32 MiB
    and trimming only past 512 MiB, the heap keeps its peak and a step reuses it. Computes
    nothing differently: an allocator's choice of addresses moves no number."""
    if platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 512 << 20)


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
    dtype: str | None = None,
    batch_size: int = 128,
) -> np.ndarray:
    """Predict a split's query points (normalised scale), as numpy ``[n, T_q, D]``, on
    ``device`` in ``dtype`` (default: where the model's weights are, in their dtype)."""
    require_numerics()
    weights = next(model.parameters())
    device = device or weights.device
    data = Tensors.of(split, device, weights.dtype if dtype is None else DTYPES[dtype])
    return predict_tensors(model, data, batch_size).cpu().numpy()


class _EagerCell:
    """The step function of one cell: its module, ``torch.optim.Adam`` and
    ``clip_grad_norm_``, eagerly (any model, e.g. Neural Laplace's native kernels on the CPU).
    A step whose loss or gradient norm is not finite is not applied (its weights stay as they
    were, as the pack's masks keep a diverged member's), and the cell is reported diverged at
    the end of the epoch."""

    graphs_used = False

    def __init__(self, model, train_data, val_data, config: TrainConfig, seed: int, device):
        self.model, self.train_data, self.val_data = model, train_data, val_data
        self.config, self.n_train = config, len(train_data)
        self.selection_metric = model.selection_metric
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
        self.order = torch.randperm(self.n_train, generator=self.gen).to(self.device)
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

    def state(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimiser": self.optimiser.state_dict(),
            "shuffle": self.gen.get_state(),
            "streams": generator_states(self.model),
        }

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimiser.load_state_dict(state["optimiser"])
        self.gen.set_state(state["shuffle"])
        restore_generators(self.model, state["streams"])


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
    checkpoints: Checkpoints | None = None,
) -> TrainResult:
    """Train ``model`` in place on ``train_split``; early-stop on ``val_split`` RMSE.

    Splits are ``datasets.SplitData`` (numpy, normalised). On return the model holds the weights
    of its best validation epoch. ``on_epoch`` is called after every epoch (e.g. to log metrics);
    setting ``stop`` ends training with :class:`TrainingInterrupted`. A NaN or infinite loss or
    gradient raises :class:`TrainingDiverged` (at the end of the epoch in which it happened; the
    model keeps the weights it had before that step).

    ``step``: ``auto`` trains a model that :func:`nltrain.packable` accepts as a pack of
    one wherever it would be packed with others (on CUDA, its step captured into a CUDA graph;
    on the CPU, all but :func:`~nltrain.prefers_one_by_one`'s models), so that a cell's
    bytes do not depend on whether it trained alone or packed: the pack's batched kernels,
    clipping and Adam round differently from the module's own kernels and
    ``torch.optim.Adam`` (by an ulp per step), and training amplifies that into a different
    model (NODE, stiff Van der Pol, quick profile: test RMSE 0.402 packed, 0.454 eagerly).
    Elsewhere it steps the module and ``torch.optim.Adam`` eagerly; ``eager`` always does the
    latter; ``packed`` always trains a pack of one (an error where the model or its splits
    cannot be packed).

    ``checkpoints`` (:class:`~nltrain.Checkpoints`, with an identity for ``label``): resume from
    the run's checkpoint there, and keep one while training (:func:`nltrain.train_loop`).
    """
    require_numerics()
    cells = step_function(
        model, train_split, val_split, config, device=device, seed=seed, label=label, step=step
    )
    callback = None if on_epoch is None else (lambda _i, r: on_epoch(r))
    options = LoopOptions((label,), callback, stop, progress, checkpoints=checkpoints)
    (result,) = train_loop(cells, config, options)
    if isinstance(result, TrainingDiverged):
        raise result
    return result


def step_function(
    model: ForecastModel,
    train_split: SplitData,
    val_split: SplitData,
    config: TrainConfig,
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
    label: str = "train",
    step: Literal["auto", "eager", "packed"] = "auto",
) -> StepFunction:
    """The step one cell trains with in :func:`train` (see its ``step``), its model moved to
    ``device`` and ``config.dtype``: run it with :func:`nltrain.train_loop`."""
    if step not in ("auto", "eager", "packed"):
        raise ValueError(f"unknown step {step!r}; valid: auto, eager, packed")
    device = torch.device(device)
    if device.type == "cpu":
        _keep_freed_memory()
    dtype = DTYPES[config.dtype]
    model.to(device=device, dtype=dtype)
    train_data = Tensors.of(train_split, device, dtype)
    val_data = Tensors.of(val_split, device, dtype)
    if len(train_data) == 0 or len(val_data) == 0:
        raise ValueError(
            f"training needs trajectories in both splits (train {len(train_data)}, "
            f"val {len(val_data)}); increase n_trajectories"
        )
    if step == "packed" or (step == "auto" and not prefers_one_by_one(model, device)):
        cells = pack_of_one(model, train_split, val_split, config, device, seed, label)
        if cells is not None:
            return cells
        if step == "packed":
            raise ValueError(f"{label}: {type(model).__name__} cannot train as a pack of one")
    return _EagerCell(model, train_data, val_data, config, seed, device)


def epoch_seconds(
    model: ForecastModel, train_split: SplitData, val_split: SplitData, config: TrainConfig, **kw
) -> tuple[float, float]:
    """Mean seconds per training epoch and mean function evaluations per training batch of
    ``model`` trained by :func:`train` (``kw``: its keywords; the step and loop a cell runs,
    validation included) for exactly ``config.epochs`` epochs
    (:meth:`~tasks.config.TrainConfig.fixed_epochs`)."""
    result = train(model, train_split, val_split, config.fixed_epochs(), **kw)
    batches = -(-len(train_split.obs_x) // config.batch_size)
    seconds = statistics.fmean(r.seconds for r in result.history)
    return seconds, statistics.fmean(r.nfe / batches for r in result.history)
