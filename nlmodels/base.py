"""The one interface every forecasting model in the platform shares.

All six models (Neural Laplace and the five baselines of the paper, Table 3) take an observed
prefix of a trajectory and predict its values at query times:

    y = model(obs_t, obs_x, query_t)            # [B, T_q, D]
    loss = model.training_loss(obs_t, obs_x, query_t, target)
    model.nfe                                   # function evaluations since the last reset

Time grids may be shared (``[T]``) or per trajectory (``[B, T]``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import nn

__all__ = [
    "ForecastModel",
    "batch_times",
    "host_bool",
    "recorded_host_bools",
    "recording_host_bools",
]

_HOST_BOOLS = threading.local()


def host_bool(t: torch.Tensor) -> bool:
    """``bool(t)``: the one place where model code reads a tensor's value on the host.

    Under ``vmap`` the members' common value (see :func:`_read_bool`). Inside
    :func:`recorded_host_bools` the values are recorded on a first (eager) pass and
    replayed on the next: a training step captured into a CUDA graph must not synchronise with
    the host, and its inputs' times (the only values these checks read) do not change.
    """
    tape = getattr(_HOST_BOOLS, "tape", None)
    if tape is None:
        return _read_bool(t)
    values, replay = tape
    if replay:
        return values.pop(0)
    value = _read_bool(t)
    values.append(value)
    return value


def _read_bool(t: torch.Tensor) -> bool:
    """``bool(t)``, also inside ``torch.func.vmap`` (packed training, one value per member):
    the members' common value; members that disagree cannot share one branch (an error)."""
    if not torch._C._functorch.is_functorch_wrapped_tensor(t):
        return bool(t)
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    if bool(t.all()):
        return True
    if not bool(t.any()):
        return False
    raise ValueError("a check on the time grids differs between packed members")


@contextlib.contextmanager
def recorded_host_bools(values: list[bool], *, replay: bool) -> Iterator[None]:
    """Record the :func:`host_bool` values of a pass into ``values``, or replay them."""
    previous = getattr(_HOST_BOOLS, "tape", None)
    _HOST_BOOLS.tape = (values if not replay else list(values), replay)
    try:
        yield
    finally:
        _HOST_BOOLS.tape = previous


def recording_host_bools() -> bool:
    """Whether :func:`host_bool` values are being recorded or replayed (a CUDA graph capture and
    its warm-up): model code must then take the same branches on every pass, e.g. no caches."""
    return getattr(_HOST_BOOLS, "tape", None) is not None


def batch_times(t: torch.Tensor, batch: int) -> torch.Tensor:
    """Return times as ``[B, T]``, broadcasting a shared ``[T]`` grid over the batch."""
    if t.dim() == 1:
        return t.unsqueeze(0).expand(batch, -1)
    if t.dim() == 2:
        if t.shape[0] not in (1, batch):
            raise ValueError(f"time grid has batch size {t.shape[0]}, expected 1 or {batch}")
        return t.expand(batch, -1)
    raise ValueError(f"times must be [T] or [B, T], got shape {tuple(t.shape)}")


class ForecastModel(nn.Module):
    """Base class: encode an observed prefix, predict the state at query times.

    Subclasses implement :meth:`forward` and count their function evaluations through
    :meth:`count_nfe` (ODE models: evaluations of the vector field; Neural Laplace: one
    evaluation of g per set of query times).
    """

    #: name in the model registry (set by :func:`nlmodels.model_registry.register_model`)
    registry_name: str = ""

    def __init__(self) -> None:
        super().__init__()
        self._nfe = 0

    @property
    def nfe(self) -> int:
        """Function evaluations since construction or the last :meth:`reset_nfe`."""
        return self._nfe

    def reset_nfe(self) -> None:
        self._nfe = 0

    def count_nfe(self, n: int = 1) -> None:
        self._nfe += int(n)

    def forward(  # pragma: no cover - abstract
        self, obs_t: torch.Tensor, obs_x: torch.Tensor, query_t: torch.Tensor
    ) -> torch.Tensor:
        raise NotImplementedError

    def training_loss(
        self,
        obs_t: torch.Tensor,
        obs_x: torch.Tensor,
        query_t: torch.Tensor,
        target: torch.Tensor,
    ) -> torch.Tensor:
        """Mean squared error of the prediction at ``query_t`` (paper protocol).

        Models trained by another objective (Latent ODE: ELBO) override this.
        """
        pred = self(obs_t, obs_x, query_t)
        return torch.mean((pred - target) ** 2)
