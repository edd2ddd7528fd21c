"""Packed training: cells that differ only in seed, trained together as one batched model.

Their tensors have identical shapes, so the members' parameters are stacked along a leading
ensemble dimension and one vectorised step (``torch.func.vmap`` over ``functional_call``) trains
them all. Each member keeps everything :func:`tasks.training.train` gives a cell on its own: its
initial weights, its shuffling (a private ``torch.Generator`` seeded with its seed), Adam with its
own moments, gradient-norm clipping over its own parameters, its validation, early stopping and
best-validation weights, and a divergence that ends only that member. A member's result equals
its unpacked run to rounding and does not depend on what it was packed with.

A member that stopped is frozen by ``torch.where`` masks (a diverged member's values may be NaN,
and NaN·0 is NaN) until the end of the epoch, then dropped from the pack.

On CUDA a training step of fixed shape (Euler solves, flows: no data-dependent control flow) is
captured once into a CUDA graph and replayed (one graph per batch size, so the last short batch
is trained too): static index, step-size and batch-number buffers, divergence flags and loss
sums kept on the device, one host read per epoch.
"""

from __future__ import annotations

import copy
import math
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.utils import parametrize

from datasets import SplitData
from nlmodels import ForecastModel
from nlmodels.base import recorded_host_bools
from tasks.config import TrainConfig
from tasks.training import (
    _DTYPES,
    EpochRecord,
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    _loss_diverged,
    _norm_diverged,
    _Tensors,
    _uses_mse,
    _val_diverged,
    epoch_bar,
    train,
)

__all__ = ["packable", "train_packed"]

# torch.optim.Adam's defaults (Kingma & Ba, 2015), as train() uses them.
_BETA1, _BETA2, _EPS = 0.9, 0.999, 1e-8
# clip_grad_norm_'s guard against division by zero.
_CLIP_EPS = 1e-6


class _GRUCell(nn.Module):
    """``nn.GRUCell`` in plain tensor ops, in the order of ATen's CPU ``gru_cell``
    (aten/src/ATen/native/RNN.cpp): ``vmap`` has no batching rule for ``gru_cell`` and would
    run it member by member."""

    def __init__(self, cell: nn.GRUCell) -> None:
        super().__init__()
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            self.register_parameter(name, getattr(cell, name))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        i_r, i_z, i_n = nn.functional.linear(x, self.weight_ih, self.bias_ih).chunk(3, -1)
        h_r, h_z, h_n = nn.functional.linear(h, self.weight_hh, self.bias_hh).chunk(3, -1)
        reset = torch.sigmoid(h_r + i_r)
        update = torch.sigmoid(h_z + i_z)
        new = torch.tanh(i_n + h_n * reset)
        return (h - new) * update + new


class _Method(nn.Module):
    """Calls one method of the wrapped model (``functional_call`` only calls ``forward``)."""

    def __init__(self, model: nn.Module, method: str) -> None:
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return getattr(self.model, self.method)(*args)


def _unparametrize(module: nn.Module) -> None:
    """Make a (copied) module with one parametrised tensor a plain one holding the original.

    Not ``parametrize.remove_parametrizations``: that deletes the tensor's property from the
    parametrised class, which the copy shares with the members' modules.
    """
    ((tname, plist),) = module.parametrizations.items()
    original = plist.original
    module.__class__ = module.__class__.__bases__[0]
    del module._modules["parametrizations"]
    module.register_parameter(tname, original)


def _replace_gru_cells(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if type(child) is nn.GRUCell:
            setattr(module, name, _GRUCell(child))
        else:
            _replace_gru_cells(child)


@dataclass
class _Pack:
    """Stacked state of the members still training (leading dimension: member)."""

    members: list[int]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    exp_avg: dict[str, torch.Tensor]
    exp_avg_sq: dict[str, torch.Tensor]
    obs_x: torch.Tensor
    target: torch.Tensor
    val_obs_x: torch.Tensor
    val_target: torch.Tensor
    active: torch.Tensor  # bool [M]: not diverged
    total: torch.Tensor  # float64 [M]: sum of batch loss × batch size this epoch
    div_kind: torch.Tensor  # long [M]: 0 none, 1 loss, 2 gradient norm
    div_value: torch.Tensor  # float64 [M]
    div_batch: torch.Tensor  # long [M]
    rows: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.rows = torch.arange(len(self.members), device=self.active.device).unsqueeze(1)

    def mutable(self) -> list[torch.Tensor]:
        return [
            *self.params.values(),
            *self.buffers.values(),
            *self.exp_avg.values(),
            *self.exp_avg_sq.values(),
            self.active,
            self.total,
            self.div_kind,
            self.div_value,
            self.div_batch,
        ]


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    idx: torch.Tensor
    nfe: int


class _Packer:
    """The batched model of several members of one architecture, and its training step."""

    def __init__(
        self,
        models: Sequence[ForecastModel],
        device: torch.device,
        clip: float | None,
        lr: float,
        obs_t: torch.Tensor,
        query_t: torch.Tensor,
    ) -> None:
        self.models = list(models)
        self.device = device
        self.clip, self.lr = clip, lr
        self.obs_t, self.query_t = obs_t, query_t
        template = self.models[0]
        # Parametrised tensors (spectral norm: a power iteration that updates its own buffers
        # in place) are computed outside vmap, by each member's own parametrisation.
        self.hoisted: list[tuple[str, str]] = []
        hoisted_buffers: set[str] = set()
        for path, module in template.named_modules():
            if parametrize.is_parametrized(module):
                if len(module.parametrizations) != 1:
                    raise TypeError("modules with several parametrised tensors are not packed")
                for tname, plist in module.parametrizations.items():
                    if not hasattr(plist, "original"):
                        raise TypeError("multi-tensor parametrisations cannot be packed")
                    prefix = f"{path}.parametrizations.{tname}".lstrip(".")
                    self.hoisted.append((path, tname))
                    hoisted_buffers |= {f"{prefix}.{b}" for b, _ in plist.named_buffers()}
        originals = {
            f"{path}.parametrizations.{tname}.original".lstrip(".") for path, tname in self.hoisted
        }
        self.param_names = [n for n, _ in template.named_parameters() if n not in originals]
        self.original_names = sorted(originals)
        self.buffer_names = [n for n, _ in template.named_buffers() if n not in hoisted_buffers]
        self.hoisted_buffer_names = sorted(hoisted_buffers)
        self.base: ForecastModel = copy.deepcopy(template)
        for path, _ in self.hoisted:  # the base receives the parametrised tensors
            _unparametrize(self.base.get_submodule(path))
        _replace_gru_cells(self.base)
        self.base.to("meta")
        self.loss_mod = _Method(self.base, "training_loss")
        self.fwd_mod = _Method(self.base, "forward")
        self.graphs: dict[tuple[tuple[int, ...], int], _Graph] = {}
        # On CUDA, Adam's step size lives in device scalars that a captured step reads (eager
        # steps read them too, so that graphs and eager steps compute the same).
        self.device_scalars = device.type == "cuda"
        self.neg_step = torch.zeros((), dtype=torch.float64, device=device)
        self.bc2_sqrt = torch.zeros((), dtype=torch.float64, device=device)
        self.batch_no = torch.zeros((), dtype=torch.long, device=device)

    # ----- state -----------------------------------------------------------------------------

    def _named(self, m: int) -> dict[str, torch.Tensor]:
        model = self.models[m]
        return {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def pack(self, members: list[int], data: dict[int, tuple[_Tensors, _Tensors]]) -> _Pack:
        named = [self._named(m) for m in members]

        def stack(name: str) -> torch.Tensor:
            return torch.stack([n[name].detach() for n in named]).clone()

        params = {n: stack(n).requires_grad_(True) for n in self.param_names + self.original_names}
        m = len(members)
        zeros = {n: torch.zeros_like(p) for n, p in params.items()}
        return _Pack(
            members=members,
            params=params,
            buffers={n: stack(n) for n in self.buffer_names},
            exp_avg=zeros,
            exp_avg_sq={n: z.clone() for n, z in zeros.items()},
            obs_x=torch.stack([data[i][0].obs_x for i in members]),
            target=torch.stack([data[i][0].target for i in members]),
            val_obs_x=torch.stack([data[i][1].obs_x for i in members]),
            val_target=torch.stack([data[i][1].target for i in members]),
            active=torch.ones(m, dtype=torch.bool, device=self.device),
            total=torch.zeros(m, dtype=torch.float64, device=self.device),
            div_kind=torch.zeros(m, dtype=torch.long, device=self.device),
            div_value=torch.zeros(m, dtype=torch.float64, device=self.device),
            div_batch=torch.zeros(m, dtype=torch.long, device=self.device),
        )

    def compact(self, pack: _Pack, keep: list[int]) -> _Pack:
        """The pack of the members at positions ``keep`` (Adam moments carried over)."""
        sel = torch.tensor(keep, dtype=torch.long, device=self.device)

        def take(d: dict[str, torch.Tensor], grad: bool = False) -> dict[str, torch.Tensor]:
            return {n: t.detach().index_select(0, sel).requires_grad_(grad) for n, t in d.items()}

        m = len(keep)
        return _Pack(
            members=[pack.members[j] for j in keep],
            params=take(pack.params, grad=True),
            buffers=take(pack.buffers),
            exp_avg=take(pack.exp_avg),
            exp_avg_sq=take(pack.exp_avg_sq),
            obs_x=pack.obs_x.index_select(0, sel),
            target=pack.target.index_select(0, sel),
            val_obs_x=pack.val_obs_x.index_select(0, sel),
            val_target=pack.val_target.index_select(0, sel),
            active=torch.ones(m, dtype=torch.bool, device=self.device),
            total=torch.zeros(m, dtype=torch.float64, device=self.device),
            div_kind=torch.zeros(m, dtype=torch.long, device=self.device),
            div_value=torch.zeros(m, dtype=torch.float64, device=self.device),
            div_batch=torch.zeros(m, dtype=torch.long, device=self.device),
        )

    @torch.no_grad()
    def write_back(self, pack: _Pack, j: int) -> None:
        """Copy member ``pack.members[j]``'s current tensors into its own module."""
        named = self._named(pack.members[j])
        for n, t in (*pack.params.items(), *pack.buffers.items()):
            named[n].copy_(t[j])

    def set_mode(self, pack: _Pack, training: bool) -> None:
        self.base.train(training)
        for m in pack.members:
            self.models[m].train(training)

    # ----- the batched model -----------------------------------------------------------------

    def _state(self, pack: _Pack) -> dict[str, torch.Tensor]:
        state = {f"model.{n}": pack.params[n] for n in self.param_names}
        state |= {f"model.{n}": b for n, b in pack.buffers.items()}
        for path, tname in self.hoisted:
            original = pack.params[f"{path}.parametrizations.{tname}.original".lstrip(".")]
            weights = []
            for j, m in enumerate(pack.members):
                plist = self.models[m].get_submodule(path).parametrizations[tname]
                w = original[j]
                for p in plist:
                    w = p(w)
                weights.append(w)
            # Passing the parametrised tensor by name bypasses the base's parametrisation.
            state[f"model.{path}.{tname}".replace("..", ".").rstrip(".")] = torch.stack(weights)
        return state

    def losses(self, pack: _Pack, obs_x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        def one(state, ox, tg):
            return functional_call(self.loss_mod, state, (self.obs_t, ox, self.query_t, tg))

        return vmap(one, randomness="error")(self._state(pack), obs_x, target)

    def predict(self, pack: _Pack, obs_x: torch.Tensor) -> torch.Tensor:
        def one(state, ox):
            return functional_call(self.fwd_mod, state, (self.obs_t, ox, self.query_t))

        return vmap(one, randomness="error")(self._state(pack), obs_x)

    # ----- one training step (eager or captured) ---------------------------------------------

    def step(self, pack: _Pack, idx: torch.Tensor, batch: int, adam: tuple) -> None:
        """Forward, backward, per-member clipping and masked Adam for the batch rows ``idx``.

        Reads no tensor value on the host, so that it can be captured into a CUDA graph.
        ``adam`` is (−step size, √bias correction 2) as floats (CPU) or device scalars (CUDA).
        """
        obs_x = pack.obs_x[pack.rows, idx]
        target = pack.target[pack.rows, idx]
        saved = self._saved_buffers(pack)
        losses = self.losses(pack, obs_x, target)
        names = list(pack.params)
        grads = torch.autograd.grad(losses.sum(), [pack.params[n] for n in names])
        with torch.no_grad():
            active = pack.active
            finite_loss = torch.isfinite(losses)
            finite_norm = torch.ones_like(finite_loss)
            norm = torch.zeros_like(pack.div_value)
            if self.clip is not None:
                norms = torch.stack(
                    [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), 2, dim=1) for g in grads],
                    dim=1,
                )
                total_norm = torch.linalg.vector_norm(norms, 2, dim=1)
                coef = torch.clamp(self.clip / (total_norm + _CLIP_EPS), max=1.0)
                grads = [g * _expand(coef, g) for g in grads]
                finite_norm = torch.isfinite(total_norm)
                norm = total_norm.to(torch.float64)
            ok = active & finite_loss & finite_norm
            bad_loss = active & ~finite_loss
            bad_norm = active & finite_loss & ~finite_norm
            pack.div_kind.copy_(torch.where(bad_loss, 1, torch.where(bad_norm, 2, pack.div_kind)))
            pack.div_value.copy_(
                torch.where(
                    bad_loss,
                    losses.to(torch.float64),
                    torch.where(bad_norm, norm, pack.div_value),
                )
            )
            pack.div_batch.copy_(torch.where(bad_loss | bad_norm, self.batch_no, pack.div_batch))
            pack.total.copy_(
                torch.where(active, pack.total + losses.to(torch.float64) * batch, pack.total)
            )
            neg_step, bc2_sqrt = adam
            for n, g in zip(names, grads):
                p, m, v = pack.params[n], pack.exp_avg[n], pack.exp_avg_sq[n]
                m_new = m.lerp(g, 1 - _BETA1)
                v_new = (v * _BETA2).addcmul_(g, g, value=1 - _BETA2)
                if isinstance(bc2_sqrt, float):
                    denom = (v_new.sqrt() / bc2_sqrt).add_(_EPS)
                    p_new = torch.addcdiv(p, m_new, denom, value=neg_step)
                else:
                    denom = (v_new.sqrt() / bc2_sqrt.to(v_new.dtype)).add_(_EPS)
                    p_new = torch.addcdiv(p, m_new * neg_step.to(m_new.dtype), denom)
                mask = _expand(ok, p)
                m.copy_(torch.where(mask, m_new, m))
                v.copy_(torch.where(mask, v_new, v))
                p.copy_(torch.where(mask, p_new, p))
            self._restore_inactive(pack, saved, active)
            pack.active.copy_(ok)

    def _saved_buffers(self, pack: _Pack) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Buffers a forward pass updates (spectral norm's power iteration) stay frozen for
        # members that stopped.
        pairs = [(b, b.clone()) for b in pack.buffers.values()]
        for m in pack.members:
            named = dict(self.models[m].named_buffers())
            pairs += [(named[n], named[n].clone()) for n in self.hoisted_buffer_names]
        return pairs

    def _restore_inactive(self, pack: _Pack, saved: list, active: torch.Tensor) -> None:
        n_stacked = len(pack.buffers)
        for buf, old in saved[:n_stacked]:
            buf.copy_(torch.where(_expand(active, buf), buf, old))
        per_member = len(self.hoisted_buffer_names)
        for k, (buf, old) in enumerate(saved[n_stacked:]):
            buf.copy_(torch.where(active[k // per_member], buf, old))

    def adam_scalars(self, n_step: int) -> tuple:
        # As torch.optim.Adam computes them (on the host, from the step count).
        bias1 = 1 - _BETA1**n_step
        bias2 = 1 - _BETA2**n_step
        neg_step, bc2_sqrt = -(self.lr / bias1), bias2**0.5
        if not self.device_scalars:
            return neg_step, bc2_sqrt
        self.neg_step.fill_(neg_step)
        self.bc2_sqrt.fill_(bc2_sqrt)
        return self.neg_step, self.bc2_sqrt

    # ----- CUDA graphs -----------------------------------------------------------------------

    def graph(self, pack: _Pack, batch: int) -> _Graph:
        key = (tuple(pack.members), batch)
        if key not in self.graphs:
            self.graphs[key] = self._capture(pack, batch)
        return self.graphs[key]

    def _capture(self, pack: _Pack, batch: int) -> _Graph:
        idx = torch.arange(batch, device=self.device).expand(len(pack.members), -1).clone()
        state = pack.mutable() + [b for m in pack.members for b in self.models[m].buffers()]
        snapshot = [t.detach().clone() for t in state]
        nfe0 = self.base.nfe
        adam = (self.neg_step, self.bc2_sqrt)
        tape: list[bool] = []
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up (lazy initialisation) outside the capture
                tape.clear()
                before = self.base.nfe
                with recorded_host_bools(tape, replay=False):
                    self.step(pack, idx, batch, adam)
                nfe = self.base.nfe - before
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():  # the warm-up steps must not count
            for t, s in zip(state, snapshot):
                t.copy_(s)
        graph = torch.cuda.CUDAGraph()  # a private memory pool: graphs share no scratch memory
        with recorded_host_bools(tape, replay=True), torch.cuda.graph(graph):
            self.step(pack, idx, batch, adam)
        self.base._nfe = nfe0
        return _Graph(graph, idx, nfe)


def _expand(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(-1, *([1] * (like.dim() - 1)))


def _probe_data(model: ForecastModel) -> tuple[torch.Tensor, ...]:
    d = int(model.state_dim)
    ot = torch.linspace(0.0, 1.0, 4, dtype=torch.float64)
    qt = torch.linspace(1.25, 2.0, 4, dtype=torch.float64)
    grid = torch.arange(2 * 3 * 4 * d, dtype=torch.float64).view(2, 3, 4, d)
    return ot, qt, torch.sin(grid), torch.cos(grid)


def packable(model: ForecastModel, device: torch.device) -> bool:
    """Whether `train_packed` trains this model exactly (pure torch, vmappable, no RNG draws in
    training).

    Not packable: models with their own objective (the Latent ODE's ELBO draws a
    reparametrised sample from each model's own generator), solvers other than Euler (adaptive
    ones have data-dependent step control; the batched Euler solve is the one that matches
    torchdiffeq's arithmetic), the adjoint method, multi-layer ``nn.GRU`` encoders, and whatever
    fails a vmapped forward and backward on two copies (custom autograd functions such as
    Neural Laplace's fused decoder).
    """
    device = torch.device(device)
    if device.type not in ("cpu", "cuda") or not _uses_mse(model):
        return False
    if getattr(model, "solver", "euler") != "euler" or getattr(model, "adjoint", False):
        return False
    if any(isinstance(m, nn.RNNBase) for m in model.modules()):
        return False
    if not isinstance(getattr(model, "state_dim", None), int):
        return False
    try:
        copies = [copy.deepcopy(model).to(dtype=torch.float64, device="cpu") for _ in range(2)]
        ot, qt, x, y = _probe_data(model)
        packer = _Packer(copies, torch.device("cpu"), 1.0, 1e-3, ot, qt)
        data = {i: (_probe_tensors(ot, x[i], qt, y[i]),) * 2 for i in range(2)}
        pack = packer.pack([0, 1], data)
        packer.set_mode(pack, True)
        packer.step(pack, torch.arange(3).expand(2, -1), 3, packer.adam_scalars(1))
        packer.set_mode(pack, False)
        with torch.no_grad():
            packer.predict(pack, pack.val_obs_x)
    except Exception:  # anything vmap cannot batch means: train one by one
        return False
    return True


def _probe_tensors(ot, x, qt, y) -> _Tensors:
    return _Tensors(ot, x, qt, y)


def _same_layout(models: Sequence[ForecastModel]) -> bool:
    """Same architecture and settings (solver, tolerances, ...): one forward serves all."""

    def layout(m: nn.Module) -> list:
        tensors = [
            (n, tuple(t.shape), t.dtype) for n, t in (*m.named_parameters(), *m.named_buffers())
        ]
        settings = [
            (
                path,
                type(mod).__name__,
                repr(
                    sorted(
                        (k, v)
                        for k, v in vars(mod).items()
                        if not k.startswith("_") and k != "training"
                    )
                ),
            )
            for path, mod in m.named_modules()
        ]
        return tensors + settings

    first = layout(models[0])
    return all(type(m) is type(models[0]) and layout(m) == first for m in models[1:])


def _same_grids(splits: Sequence[SplitData]) -> bool:
    s0 = splits[0]
    return all(
        np.asarray(s.obs_t).ndim == 1
        and np.asarray(s.query_t).ndim == 1
        and np.array_equal(s.obs_t, s0.obs_t)
        and np.array_equal(s.query_t, s0.query_t)
        and s.obs_x.shape == s0.obs_x.shape
        and s.target.shape == s0.target.shape
        for s in splits
    )


def _one_by_one(
    models, train_splits, val_splits, config, device, seeds, on_epoch, stop, progress, labels
) -> list[TrainResult | TrainingDiverged]:
    results: list[TrainResult | TrainingDiverged] = []
    for i, model in enumerate(models):
        callback = None if on_epoch is None else (lambda r, i=i: on_epoch(i, r))
        try:
            results.append(
                train(
                    model,
                    train_splits[i],
                    val_splits[i],
                    config,
                    device=device,
                    seed=seeds[i],
                    on_epoch=callback,
                    stop=stop,
                    progress=progress,
                    label=labels[i],
                )
            )
        except TrainingDiverged as e:
            results.append(e)
    return results


def train_packed(
    models: Sequence[ForecastModel],
    train_splits: Sequence[SplitData],
    val_splits: Sequence[SplitData],
    config: TrainConfig,
    *,
    device: torch.device | str = "cpu",
    seeds: Sequence[int],
    on_epoch: Callable[[int, EpochRecord], None] | None = None,
    stop: threading.Event | None = None,
    progress: bool = False,
    labels: Sequence[str] | None = None,
    graphs: bool | None = None,
) -> list[TrainResult | TrainingDiverged]:
    """Train ``models[i]`` on ``train_splits[i]`` with seed ``seeds[i]``, all in one batch.

    Each member's result (and the best-validation weights left in its module) is that of
    ``train(models[i], train_splits[i], val_splits[i], config, seed=seeds[i],
    label=labels[i])``; a member that diverges gets its :class:`TrainingDiverged` in its place
    of the returned list and leaves the others running. ``on_epoch(i, record)`` is called after
    each of member ``i``'s epochs. Setting ``stop`` raises :class:`TrainingInterrupted`.

    A single member, models that are not :func:`packable` or that differ in architecture, and
    splits whose shapes or time grids differ are trained one by one by :func:`train`.
    ``max_train_seconds`` is per cell: the pack trains for up to ``n`` times it (as ``n``
    cells one after another would), and its wall time is each member's ``seconds`` and its
    epochs' ``seconds``.
    ``graphs``: capture the training step into a CUDA graph (``None``: on CUDA, falling back
    to eager steps if the capture fails; ``True`` makes a failed capture an error).
    """
    n = len(models)
    if not (len(train_splits) == len(val_splits) == len(seeds) == n):
        raise ValueError(
            f"train_packed needs one train split, val split and seed per model; got {n} "
            f"models, {len(train_splits)} train splits, {len(val_splits)} val splits and "
            f"{len(seeds)} seeds"
        )
    if labels is None:
        labels = ["train"] * n
    elif len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries for {n} models")
    device = torch.device(device)
    if graphs and device.type != "cuda":
        raise ValueError(f"graphs=True needs a CUDA device, got {device}")
    dtype = _DTYPES[config.dtype]
    for model in models:
        model.to(device=device, dtype=dtype)
    if (
        n < 2
        or not all(packable(m, device) for m in models)
        or not _same_layout(models)
        or not _same_grids(train_splits)
        or not _same_grids(val_splits)
        or not np.array_equal(train_splits[0].obs_t, val_splits[0].obs_t)
        or not np.array_equal(train_splits[0].query_t, val_splits[0].query_t)
        or min(s.obs_x.shape[0] for s in (*train_splits, *val_splits)) == 0
    ):
        return _one_by_one(
            models,
            train_splits,
            val_splits,
            config,
            device,
            seeds,
            on_epoch,
            stop,
            progress,
            labels,
        )
    return _Run(models, train_splits, val_splits, config, device, seeds, labels).run(
        on_epoch, stop, progress, graphs
    )


@dataclass
class _Member:
    best_rmse: float = math.inf
    best_epoch: int = -1
    best_state: dict | None = None
    history: list[EpochRecord] = field(default_factory=list)
    result: TrainResult | TrainingDiverged | None = None


class _Run:
    def __init__(self, models, train_splits, val_splits, config, device, seeds, labels):
        self.models, self.config, self.device = list(models), config, device
        self.seeds, self.labels = list(seeds), list(labels)
        dtype = _DTYPES[config.dtype]
        self.data = {
            i: (
                _Tensors.of(train_splits[i], device, dtype),
                _Tensors.of(val_splits[i], device, dtype),
            )
            for i in range(len(models))
        }
        first = self.data[0][0]
        self.packer = _Packer(
            self.models, device, config.grad_clip, config.lr, first.obs_t, first.query_t
        )

    def run(self, on_epoch, stop, progress, graphs) -> list[TrainResult | TrainingDiverged]:
        config, packer, models = self.config, self.packer, self.models
        n_members = len(models)
        use_graphs = self.device.type == "cuda" and graphs is not False
        graphs_used = False
        gens = [torch.Generator().manual_seed(s) for s in self.seeds]
        members = [_Member(best_state=copy.deepcopy(m.state_dict())) for m in models]
        self.members = members
        pack = packer.pack(list(range(n_members)), self.data)
        n_train = len(self.data[0][0])
        n_val = len(self.data[0][1])
        bs = config.batch_size
        n_step = 0
        t_start = time.perf_counter()
        # The time budget is per cell: M packed cells hold one worker for up to M budgets, as
        # they would one after another, and spend packing's savings on more epochs.
        budget = None if config.max_train_seconds is None else config.max_train_seconds * n_members
        label = self.labels[0] if n_members == 1 else f"{self.labels[0]} (+{n_members - 1})"
        bar = epoch_bar(config, label, progress, budget)
        for epoch in bar:
            t0 = time.perf_counter()
            packer.set_mode(pack, True)
            packer.base.reset_nfe()
            orders = torch.stack(
                [torch.randperm(n_train, generator=gens[m]).to(self.device) for m in pack.members]
            )
            pack.total.zero_()
            for b_i, start in enumerate(range(0, n_train, bs)):
                if stop is not None and stop.is_set():
                    raise TrainingInterrupted(
                        f"{', '.join(self.labels[m] for m in pack.members)}: stopped at "
                        f"epoch {epoch}"
                    )
                batch = min(bs, n_train - start)
                n_step += 1
                adam = packer.adam_scalars(n_step)
                packer.batch_no.fill_(b_i)
                rows = orders[:, start : start + batch]
                if use_graphs:
                    try:
                        g = packer.graph(pack, batch)
                    except Exception as e:
                        if graphs:
                            raise RuntimeError(
                                f"{label}: capturing the training step into a CUDA graph "
                                f"failed ({e}); use graphs=None or False for eager steps"
                            ) from e
                        warnings.warn(
                            f"{label}: CUDA graph capture failed ({e}); eager steps",
                            RuntimeWarning,
                            stacklevel=2,
                        )
                        use_graphs = False
                    else:
                        g.idx.copy_(rows)
                        g.graph.replay()
                        packer.base.count_nfe(g.nfe)
                        graphs_used = True
                        continue
                packer.step(pack, rows, batch, adam)
            nfe = packer.base.nfe
            active = pack.active.tolist()
            totals = pack.total.tolist()
            kinds, values, batches = (
                pack.div_kind.tolist(),
                pack.div_value.tolist(),
                pack.div_batch.tolist(),
            )
            packer.set_mode(pack, False)
            with torch.no_grad():
                preds = torch.cat(
                    [
                        packer.predict(pack, pack.val_obs_x[:, s : s + bs])
                        for s in range(0, n_val, bs)
                    ],
                    dim=1,
                )
            seconds = time.perf_counter() - t0
            keep = []
            for j, m in enumerate(pack.members):
                mem, lab = members[m], self.labels[m]
                if not active[j]:
                    make = _loss_diverged if kinds[j] == 1 else _norm_diverged
                    self._diverge(pack, j, make(lab, values[j], epoch, batches[j]))
                    continue
                mse = torch.mean((preds[j] - pack.val_target[j]) ** 2).item()
                val_rmse = math.sqrt(mse)
                if not math.isfinite(val_rmse):
                    self._diverge(pack, j, _val_diverged(lab, val_rmse, epoch))
                    continue
                record = EpochRecord(epoch, totals[j] / n_train, mse, val_rmse, seconds, nfe)
                mem.history.append(record)
                if val_rmse < mem.best_rmse:
                    mem.best_rmse, mem.best_epoch = val_rmse, epoch
                    packer.write_back(pack, j)
                    mem.best_state = copy.deepcopy(models[m].state_dict())
                if on_epoch is not None:
                    on_epoch(m, record)
                stopped: Literal["epochs", "early_stopping", "time_budget"] | None = None
                if config.patience is not None and epoch - mem.best_epoch >= config.patience:
                    stopped = "early_stopping"
                elif budget is not None and time.perf_counter() - t_start >= budget:
                    stopped = "time_budget"
                elif epoch == config.epochs - 1:
                    stopped = "epochs"
                if stopped is None:
                    keep.append(j)
                    continue
                models[m].load_state_dict(mem.best_state)
                models[m].eval()
                models[m]._nfe = nfe
                mem.result = TrainResult(
                    tuple(mem.history),
                    mem.best_epoch,
                    mem.best_rmse,
                    stopped,
                    time.perf_counter() - t_start,
                    packed_members=n_members,
                    graphs=graphs_used,
                )
            bar.set_postfix(members=len(keep))
            if not keep:
                break
            if len(keep) < len(pack.members):
                pack = packer.compact(pack, keep)
                packer.graphs.clear()  # captured for the previous pack's tensors
        bar.close()
        return [mem.result for mem in members]  # type: ignore[misc]

    def _diverge(self, pack: _Pack, j: int, error: TrainingDiverged) -> None:
        # As train() leaves a model that raised: its weights at that moment, in training mode.
        m = pack.members[j]
        self.packer.write_back(pack, j)
        self.models[m].train()
        self.members[m].result = error
