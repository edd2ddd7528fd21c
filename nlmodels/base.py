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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

__all__ = [
    "ForecastModel",
    "MemberRun",
    "batch_times",
    "host_bool",
    "recorded_host_bools",
    "recording_host_bools",
]

#: ``run(fn, *batched)`` in packed training: ``fn(model, *args)`` called for every member of a
#: pack at once (``torch.func.vmap`` over ``functional_call`` with each member's tensors), where
#: each of ``batched`` has a leading member dimension; returns results with that dimension.
MemberRun = Callable[..., Any]

_HOST_BOOLS = threading.local()


def _on_grids(run: MemberRun, fn: Callable, obs_t, query_t, obs_x, *rest) -> Any:
    """``fn(model, obs_t, obs_x, query_t, *rest)`` of every member through ``run``, with the
    members' shared time grids (``[T]``) or each member's own (``[M, T]``)."""
    if obs_t.dim() == 1:
        return run(lambda m, ox, *r: fn(m, obs_t, ox, query_t, *r), obs_x, *rest)
    return run(fn, obs_t, obs_x, query_t, *rest)


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
    #: which validation score picks the weights training keeps (and early stopping watches):
    #: ``val_rmse``, or ``val_loss``, the model's own objective (a VAE's negative ELBO)
    selection_metric: Literal["val_rmse", "val_loss"] = "val_rmse"
    #: whether the model's ``ilt`` option takes linear ILT algorithms only (one with
    #: :meth:`~nlmodels.ilt.ILTAlgorithm.weights`): a config names only those for it
    linear_ilt_only: bool = False
    #: evaluations counted on the device and not yet read (:meth:`count_nfe`); absent until then
    _nfe_pending: torch.Tensor | None

    def __init__(self) -> None:
        super().__init__()
        self._nfe = 0

    @property
    def nfe(self) -> int:
        """Function evaluations since construction or the last :meth:`reset_nfe`."""
        pending = getattr(self, "_nfe_pending", None)
        if pending is not None:  # counts kept on the device, read when asked for
            self._nfe += int(pending)
            self._nfe_pending = None
        return self._nfe

    def reset_nfe(self) -> None:
        self._nfe = 0
        self._nfe_pending = None

    def count_nfe(self, n: int | torch.Tensor = 1) -> None:
        """Add ``n`` evaluations; a tensor count is summed on its device (no host read)."""
        if isinstance(n, torch.Tensor):
            pending = getattr(self, "_nfe_pending", None)
            n = n.detach()
            self._nfe_pending = n if pending is None else pending + n
        else:
            self._nfe += int(n)

    # ----- packed training (nltrain._packing): members of one architecture trained at once -----

    def packs_itself(self) -> bool:
        """Whether :meth:`packed_losses` and :meth:`packed_forward` give each member exactly its
        unpacked result even where a plain ``vmap`` of the model cannot (its own random draws,
        an adaptive solve). The default methods below are that plain ``vmap``. Members of a
        model that packs itself share their time grids (``nltrain._packing`` packs them so)."""
        return False

    def captures_packed(self) -> bool:
        """Whether a pack's training step may be captured into a CUDA graph: it reads nothing
        on the host while captured. A plain ``vmap`` may; a model that packs itself says so."""
        return not self.packs_itself()

    def graph_generators(self, members: Sequence[ForecastModel]) -> list[torch.Generator]:
        """The CUDA generators a captured training step of ``members`` draws from (registered
        with the graph, so that each replay draws anew)."""
        return []

    def graph_epoch_end(self, members: Sequence[ForecastModel]) -> str | None:
        """Called once an epoch of a pack's steps (replayed or not): hands ``members`` what a
        replay counted for them on the device, and says why a captured step could not compute
        what its eager step computes (then an error), or None."""
        return None

    def graph_recapture(self) -> bool:
        """Asked after :meth:`graph_epoch_end`: whether the captured steps should be captured
        again before the next epoch (a size fixed at capture no longer has its headroom)."""
        return False

    def packed_losses(
        self,
        members: Sequence[ForecastModel],
        state: Mapping[str, torch.Tensor],
        run: MemberRun,
        obs_t: torch.Tensor,
        obs_x: torch.Tensor,
        query_t: torch.Tensor,
        target: torch.Tensor,
    ) -> torch.Tensor:
        """Each member's :meth:`training_loss`, ``[M]``, on its batch ``obs_x [M, B, T_o, D]``,
        ``target [M, B, T_q, D]``; the time grids ``obs_t``/``query_t`` are shared (``[T]``) or
        each member's own (``[M, T]``: members of other systems). Called on a template of the
        architecture; ``members`` are the members' own modules (their random streams),
        ``state`` their stacked tensors by name (``[M, ...]``), ``run`` the vmapped call
        (:data:`MemberRun`)."""
        return _on_grids(run, type(self).training_loss, obs_t, query_t, obs_x, target)

    def packed_forward(
        self,
        members: Sequence[ForecastModel],
        state: Mapping[str, torch.Tensor],
        run: MemberRun,
        obs_t: torch.Tensor,
        obs_x: torch.Tensor,
        query_t: torch.Tensor,
    ) -> torch.Tensor:
        """Each member's prediction ``[M, B, T_q, D]`` (arguments as :meth:`packed_losses`)."""
        return _on_grids(run, type(self).__call__, obs_t, query_t, obs_x)

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
