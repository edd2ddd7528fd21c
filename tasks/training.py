"""Training loop of the paper's protocol, as a plain function (no Prefect, no MLflow).

Adam, mini-batches over trajectories, gradient-norm clipping, float64 by default, early stopping
on validation RMSE with the best-validation weights restored at the end.
"""

from __future__ import annotations

import copy
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from nlmodels import ForecastModel
from tasks.config import TrainConfig

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

_DTYPES = {"float64": torch.float64, "float32": torch.float32}
# torch's CPU generator is process-global: seeding and drawing initial weights must not interleave
# between concurrently running cells, or the same seed would give different models.
_RNG_LOCK = threading.Lock()


class TrainingDiverged(RuntimeError):
    """The loss or the gradients became NaN or infinite."""


class TrainingInterrupted(RuntimeError):
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
    """Seed torch, numpy and random while holding the process-wide RNG lock."""
    with _RNG_LOCK:
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)  # noqa: NPY002 - third-party code may draw from it
        random.seed(seed)
        yield


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


def _as_tensor(a: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    # A copy: cached data sets are read-only arrays, and torch wants writable memory.
    return torch.tensor(np.asarray(a), dtype=dtype, device=device)


def _rows(t: torch.Tensor, idx: torch.Tensor | slice) -> torch.Tensor:
    # Times are shared ([T]) or per trajectory ([n, T]); only the latter is indexed by trajectory.
    return t[idx] if t.dim() == 2 else t


@dataclass(frozen=True)
class _Tensors:
    obs_t: torch.Tensor
    obs_x: torch.Tensor
    query_t: torch.Tensor
    target: torch.Tensor

    @classmethod
    def of(cls, split, device: torch.device, dtype: torch.dtype) -> _Tensors:
        return cls(
            *(
                _as_tensor(getattr(split, f), device, dtype)
                for f in ("obs_t", "obs_x", "query_t", "target")
            )
        )

    def __len__(self) -> int:
        return self.obs_x.shape[0]

    def batch(self, idx: torch.Tensor | slice) -> _Tensors:
        return _Tensors(
            _rows(self.obs_t, idx), self.obs_x[idx], _rows(self.query_t, idx), self.target[idx]
        )


@torch.no_grad()
def _predict_tensors(model: ForecastModel, data: _Tensors, batch_size: int) -> torch.Tensor:
    model.eval()
    outs = []
    for start in range(0, len(data), batch_size):
        b = data.batch(slice(start, start + batch_size))
        outs.append(model(b.obs_t, b.obs_x, b.query_t))
    return torch.cat(outs, dim=0)


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
    data = _Tensors.of(split, device, _DTYPES[dtype])
    return _predict_tensors(model, data, batch_size).cpu().numpy()


def _uses_mse(model: ForecastModel) -> bool:
    return type(model).training_loss is ForecastModel.training_loss


@torch.no_grad()
def _validate(model: ForecastModel, val: _Tensors, batch_size: int) -> tuple[float, float]:
    pred = _predict_tensors(model, val, batch_size)
    mse = torch.mean((pred - val.target) ** 2).item()
    if _uses_mse(model):
        return mse, math.sqrt(mse)
    # Models with their own objective (Latent ODE: ELBO): report it, so curves are comparable.
    losses = [
        model.training_loss(b.obs_t, b.obs_x, b.query_t, b.target).item() * len(b)
        for b in (val.batch(slice(s, s + batch_size)) for s in range(0, len(val), batch_size))
    ]
    return sum(losses) / len(val), math.sqrt(mse)


def epoch_bar(config: TrainConfig, label: str, progress: bool, budget: float | None = None):
    """The epochs of a training run as a tqdm bar. Under a time budget (``budget`` seconds,
    default ``config.max_train_seconds``) the epoch ceiling is not where the run ends, so the
    bar counts epochs and names the budget instead of showing an ETA to the ceiling."""
    budget = config.max_train_seconds if budget is None else budget
    epochs: Iterable[int] = range(config.epochs)
    if budget is not None:
        epochs, label = iter(epochs), f"{label} (budget {budget:.0f} s)"
    return tqdm(epochs, desc=label, disable=not progress, leave=True, unit="ep")


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
) -> TrainResult:
    """Train ``model`` in place on ``train_split``; early-stop on ``val_split`` RMSE.

    Splits are ``datasets.SplitData`` (numpy, normalised). On return the model holds the weights
    of its best validation epoch. ``on_epoch`` is called after every epoch (e.g. to log metrics);
    setting ``stop`` ends training with :class:`TrainingInterrupted`. A NaN or infinite loss or
    gradient raises :class:`TrainingDiverged`.
    """
    device = torch.device(device)
    dtype = _DTYPES[config.dtype]
    model.to(device=device, dtype=dtype)
    train_data = _Tensors.of(train_split, device, dtype)
    val_data = _Tensors.of(val_split, device, dtype)
    if len(train_data) == 0 or len(val_data) == 0:
        raise ValueError(
            f"training needs trajectories in both splits (train {len(train_data)}, "
            f"val {len(val_data)}); increase n_trajectories"
        )
    optimiser = torch.optim.Adam(model.parameters(), lr=config.lr)
    # A private generator: the shuffling order depends on this cell's seed only.
    gen = torch.Generator().manual_seed(seed)
    best_rmse, best_epoch, best_state = math.inf, -1, copy.deepcopy(model.state_dict())
    history: list[EpochRecord] = []
    stopped: Literal["epochs", "early_stopping", "time_budget"] = "epochs"
    t_start = time.perf_counter()

    bar = epoch_bar(config, label, progress)
    for epoch in bar:
        t0 = time.perf_counter()
        model.train()
        model.reset_nfe()
        order = torch.randperm(len(train_data), generator=gen).to(device)
        total, count = 0.0, 0
        for b_i, start in enumerate(range(0, len(train_data), config.batch_size)):
            if stop is not None and stop.is_set():
                raise TrainingInterrupted(f"{label}: stopped at epoch {epoch}")
            b = train_data.batch(order[start : start + config.batch_size])
            optimiser.zero_grad(set_to_none=True)
            loss = model.training_loss(b.obs_t, b.obs_x, b.query_t, b.target)
            if not torch.isfinite(loss):
                raise _loss_diverged(label, loss.item(), epoch, b_i)
            loss.backward()
            if config.grad_clip is not None:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                if not torch.isfinite(norm):
                    raise _norm_diverged(label, norm.item(), epoch, b_i)
            optimiser.step()
            total += loss.item() * len(b)
            count += len(b)
        nfe = model.nfe
        val_loss, val_rmse = _validate(model, val_data, config.batch_size)
        if not math.isfinite(val_rmse):
            raise _val_diverged(label, val_rmse, epoch)
        record = EpochRecord(
            epoch, total / count, val_loss, val_rmse, time.perf_counter() - t0, nfe
        )
        history.append(record)
        if val_rmse < best_rmse:
            best_rmse, best_epoch = val_rmse, epoch
            best_state = copy.deepcopy(model.state_dict())
        bar.set_postfix(loss=f"{record.train_loss:.4g}", val_rmse=f"{val_rmse:.4g}")
        if on_epoch is not None:
            on_epoch(record)
        if config.patience is not None and epoch - best_epoch >= config.patience:
            stopped = "early_stopping"
            break
        if (
            config.max_train_seconds is not None
            and time.perf_counter() - t_start >= config.max_train_seconds
        ):
            stopped = "time_budget"
            break
    bar.close()
    model.load_state_dict(best_state)
    model.eval()
    return TrainResult(
        tuple(history), best_epoch, best_rmse, stopped, time.perf_counter() - t_start
    )
