"""The pieces a training step is made of, shared by a single cell's eager step
(:mod:`nltrain._training`) and a pack's batched step (:mod:`nltrain._packed_cells`): a split's
tensors on the device, the validation, and the per-step bookkeeping that stays on the device
until the training loop reads it once per epoch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nlmodels import ForecastModel

__all__ = [
    "DTYPES",
    "Flags",
    "Readout",
    "Tensors",
    "as_tensor",
    "predict_tensors",
    "read_epoch",
    "record_step",
    "uses_mse",
    "validate",
]

#: The config's ``dtype`` names as torch dtypes.
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def as_tensor(a: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A writable copy of ``a`` as a ``dtype`` tensor on ``device`` (cached data sets and the
    arrays MLflow hands over are read-only, and torch wants writable memory)."""
    return torch.tensor(np.asarray(a), dtype=dtype, device=device)


def _rows(t: torch.Tensor, idx: torch.Tensor | slice) -> torch.Tensor:
    # Times are shared ([T]) or per trajectory ([n, T]); only the latter is indexed by trajectory.
    return t[idx] if t.dim() == 2 else t


@dataclass(frozen=True)
class Tensors:
    """A split's arrays (``datasets.SplitData``) as tensors on the training device; times are
    shared ``[T]`` or per trajectory ``[n, T]``."""

    obs_t: torch.Tensor
    obs_x: torch.Tensor
    query_t: torch.Tensor
    target: torch.Tensor

    @classmethod
    def of(cls, split, device: torch.device, dtype: torch.dtype) -> Tensors:
        return cls(
            *(
                as_tensor(getattr(split, f), device, dtype)
                for f in ("obs_t", "obs_x", "query_t", "target")
            )
        )

    def __len__(self) -> int:
        return self.obs_x.shape[0]

    def batch(self, idx: torch.Tensor | slice) -> Tensors:
        return Tensors(
            _rows(self.obs_t, idx), self.obs_x[idx], _rows(self.query_t, idx), self.target[idx]
        )


@torch.no_grad()
def predict_tensors(model: ForecastModel, data: Tensors, batch_size: int) -> torch.Tensor:
    model.eval()
    outs = []
    for start in range(0, len(data), batch_size):
        b = data.batch(slice(start, start + batch_size))
        outs.append(model(b.obs_t, b.obs_x, b.query_t))
    return torch.cat(outs, dim=0)


def uses_mse(model: ForecastModel) -> bool:
    return type(model).training_loss is ForecastModel.training_loss


@torch.no_grad()
def validate(
    model: ForecastModel, val: Tensors, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation loss and RMSE as float64 device scalars (read with the epoch's flags)."""
    pred = predict_tensors(model, val, batch_size)
    mse = torch.mean((pred - val.target) ** 2).to(torch.float64)
    if uses_mse(model):
        return mse, mse.sqrt()
    # Models with their own objective (Latent ODE: ELBO): report it, so curves are comparable.
    total = torch.zeros((), dtype=torch.float64, device=mse.device)
    for s in range(0, len(val), batch_size):
        b = val.batch(slice(s, s + batch_size))
        loss = model.training_loss(b.obs_t, b.obs_x, b.query_t, b.target)
        total = total + loss.to(torch.float64) * len(b)
    return total / len(val), mse.sqrt()


@dataclass(frozen=True)
class Readout:
    """One epoch of the cells still training, read to the host once (position j: the j-th of
    ``cells.members``)."""

    active: list[bool]  # not diverged during the epoch
    totals: list[float]  # sum over batches of loss × batch size
    div_kind: list[int]  # 0 none, 1 loss, 2 gradient norm
    div_value: list[float]
    div_batch: list[int]
    val_loss: list[float]
    val_rmse: list[float]
    nfe: list[int]  # function evaluations of each cell's epoch


def record_step(flags, losses: torch.Tensor, norm: torch.Tensor | None, batch_no, batch: int):
    """Device-side bookkeeping of one step for ``flags`` (tensors ``active``, ``total``,
    ``div_kind``, ``div_value``, ``div_batch``, one entry per cell, or 0-dim for one cell): the
    first non-finite loss or gradient norm of each cell, and the loss sum of those still active.
    Returns which cells may take the step (active and finite). Reads nothing on the host."""
    active = flags.active
    finite_loss = torch.isfinite(losses)
    loss64 = losses.detach().to(torch.float64)
    if norm is None:
        finite_norm, norm64 = torch.ones_like(finite_loss), torch.zeros_like(loss64)
    else:
        finite_norm, norm64 = torch.isfinite(norm), norm.detach().to(torch.float64)
    ok = active & finite_loss & finite_norm
    bad_loss = active & ~finite_loss
    bad_norm = active & finite_loss & ~finite_norm
    flags.div_kind.copy_(torch.where(bad_loss, 1, torch.where(bad_norm, 2, flags.div_kind)))
    flags.div_value.copy_(
        torch.where(bad_loss, loss64, torch.where(bad_norm, norm64, flags.div_value))
    )
    flags.div_batch.copy_(torch.where(bad_loss | bad_norm, batch_no, flags.div_batch))
    flags.total.copy_(torch.where(active, flags.total + loss64 * batch, flags.total))
    flags.active.copy_(ok)
    return ok


def read_epoch(
    flags, val_loss: torch.Tensor, val_rmse: torch.Tensor, nfe: int | Sequence[int]
) -> Readout:
    """The epoch's one host read: ``flags`` (see :func:`record_step`) and the validation;
    ``nfe``: one count for all cells, or one per cell."""
    tensors = (flags.active, flags.total, flags.div_kind, flags.div_value, flags.div_batch)
    values = torch.stack(
        [t.reshape(-1).to(torch.float64) for t in (*tensors, val_loss, val_rmse)]
    ).tolist()
    active, totals, kinds, div_values, batches, v_loss, v_rmse = values
    return Readout(
        [bool(a) for a in active],
        totals,
        [int(k) for k in kinds],
        div_values,
        [int(b) for b in batches],
        v_loss,
        v_rmse,
        [nfe] * len(v_rmse) if isinstance(nfe, int) else list(nfe),
    )


@dataclass
class Flags:
    """The per-step bookkeeping of one cell, on its device (see :func:`record_step`)."""

    active: torch.Tensor
    total: torch.Tensor
    div_kind: torch.Tensor
    div_value: torch.Tensor
    div_batch: torch.Tensor

    @classmethod
    def zeros(cls, shape: tuple[int, ...], device: torch.device) -> Flags:
        def z(dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            torch.ones(shape, dtype=torch.bool, device=device),
            z(torch.float64),
            z(torch.long),
            z(torch.float64),
            z(torch.long),
        )
