"""Packed training: cells of one model whose tensors have the same shapes (seeds, and systems
of the same dimensions), trained together as one batched model.

The members' parameters are stacked along a leading ensemble dimension and one vectorised step
(``torch.func.vmap`` over ``functional_call``) trains them all; members whose time grids differ
(other systems) get their own grids through the same ``vmap``. Models run their plain formulas
under ``vmap`` (Neural Laplace: :func:`nlmodels.accel.select`; ``nn.GRU`` and ``nn.GRUCell`` are
swapped for the same maths in plain tensor ops).

Each member keeps everything :func:`tasks.training.train` gives a cell on its own: its initial
weights, its shuffling (a private ``torch.Generator`` seeded with its seed), Adam with its
own moments, gradient-norm clipping over its own parameters, its validation, early stopping and
best-validation weights, and a divergence that ends only that member. A member's result equals
its unpacked run to rounding and does not depend on what it was packed with.

A member that stopped is frozen by ``torch.where`` masks (a diverged member's values may be NaN,
and NaN·0 is NaN) until the end of the epoch, then dropped from the pack. The epochs, stopping
rules and best weights are those of :func:`tasks.training.train`: one loop drives both.

On CUDA a training step of fixed shape (Euler solves, flows: no data-dependent control flow) is
captured once into a CUDA graph and replayed (one graph per batch size, so the last short batch
is trained too): static index, step-size and batch-number buffers, divergence flags and loss
sums kept on the device, one host read per epoch.
"""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
    TrainResult,
    _read_epoch,
    _Readout,
    _record_step,
    _Tensors,
    _train_loop,
    _uses_mse,
    _validate,
    train,
)

__all__ = ["packable", "prefers_one_by_one", "train_packed"]

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


class _GRU(nn.Module):
    """A multi-layer ``nn.GRU`` (unidirectional, no dropout or projection, zero initial state) in
    plain tensor ops, which ``vmap`` batches (it cannot batch the fused RNN kernels). Same
    parameter names, so a state dict of ``nn.GRU`` fits.

    The layers advance as one wavefront (as :mod:`nlmodels.accel.gru` does with its own
    backward): at step k layer l processes time k − l, so all layers take one matrix product
    and a few elementwise kernels per step, over T + L − 1 steps instead of L·T. The state row
    is ``[h_0 | … | h_{L−1}]``; the product gives every layer's hidden-side gates and (from the
    layer below) input-side gates at once, layer 0's input side is computed for all steps
    beforehand. Layers that have not started keep a zero state; a finished layer's later
    values reach no live layer."""

    def __init__(self, gru: nn.GRU) -> None:
        super().__init__()
        self.num_layers, self.hidden_size = gru.num_layers, gru.hidden_size
        self.batch_first = gru.batch_first
        for name, param in gru.named_parameters():
            self.register_parameter(name, param)

    def _weights(self, name: str) -> list[torch.Tensor]:
        return [getattr(self, f"{name}_l{layer}") for layer in range(self.num_layers)]

    def _block(self) -> torch.Tensor:
        """[L·H, 2·L·3H]: state rows → (hidden-side gates of every layer | input-side gates)."""
        n_layers, h = self.num_layers, self.hidden_size
        w_ih, w_hh = self._weights("weight_ih"), self._weights("weight_hh")
        zero = w_hh[0].new_zeros(h, 3 * h)
        rows = []
        for layer in range(n_layers):
            hidden = [w_hh[layer].T if k == layer else zero for k in range(n_layers)]
            inputs = [w_ih[k].T if k == layer + 1 else zero for k in range(n_layers)]
            rows.append(torch.cat(hidden + inputs, dim=1))
        return torch.cat(rows, dim=0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.batch_first:
            x = x.transpose(0, 1)
        batch, n_time = x.shape[:2]
        n_layers, h = self.num_layers, self.hidden_size
        n_steps = n_time + n_layers - 1
        w_ih, b_ih, b_hh = (
            self._weights("weight_ih"),
            self._weights("bias_ih"),
            self._weights("bias_hh"),
        )
        # What each step adds to the product: biases, and layer 0's input side (after the
        # last time point: its bias alone; layer 0 is finished then).
        first = nn.functional.linear(x, w_ih[0], b_ih[0])  # [B, T, 3H]
        first = torch.cat((first, b_ih[0].expand(batch, n_layers - 1, 3 * h)), dim=1)
        step_terms = torch.cat(
            (
                torch.cat(b_hh).expand(batch, n_steps, n_layers * 3 * h),
                first,
                *(b.expand(batch, n_steps, 3 * h) for b in b_ih[1:]),
            ),
            dim=-1,
        )
        # unbind: one backward node for all steps (indexing step k would materialise a
        # gradient of the whole tensor at every step)
        step_terms = step_terms.unbind(1)
        block = self._block()
        state = x.new_zeros(batch, n_layers * h)
        outs, finals = [], [state[:, :h]] * n_layers
        for k in range(n_steps):
            gates = torch.addmm(step_terms[k], state, block).view(batch, 2, n_layers, 3, h)
            hidden, inputs = gates[:, 0], gates[:, 1]
            rz = torch.sigmoid(inputs[:, :, :2] + hidden[:, :, :2])
            new = torch.tanh(torch.addcmul(inputs[:, :, 2], rz[:, :, 0], hidden[:, :, 2]))
            h_all = (state.view(batch, n_layers, h) - new) * rz[:, :, 1] + new
            if k < n_layers - 1:  # layers above k have not started
                h_all = torch.cat(
                    (h_all[:, : k + 1], h_all.new_zeros(batch, n_layers - k - 1, h)), 1
                )
            state = h_all.reshape(batch, n_layers * h)
            if k >= n_layers - 1:
                outs.append(h_all[:, -1])
            for layer in range(n_layers):
                if k == n_time - 1 + layer:
                    finals[layer] = h_all[:, layer]
        out = torch.stack(outs, dim=1)
        return (out if self.batch_first else out.transpose(0, 1)), torch.stack(finals)


def _plain_gru(module: nn.Module) -> bool:
    return (
        type(module) is nn.GRU
        and module.bias
        and not module.bidirectional
        and not module.dropout
        and not module.proj_size
    )


class _Call(nn.Module):
    """Calls ``fn(model, *args)`` on the wrapped model (``functional_call`` only calls
    ``forward``)."""

    def __init__(self, model: nn.Module, fn: Callable) -> None:
        super().__init__()
        self.model = model
        self.fn = fn

    def forward(self, *args: torch.Tensor):
        return self.fn(self.model, *args)


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
        elif _plain_gru(child):
            setattr(module, name, _GRU(child))
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
    #: per-member time grids [M, T] where the members' grids differ (None: the packer's own)
    obs_t: torch.Tensor | None = None
    query_t: torch.Tensor | None = None
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
        obs_t: torch.Tensor | None,
        query_t: torch.Tensor | None,
    ) -> None:
        """``obs_t``/``query_t``: the members' shared time grids, or None for per-member grids
        (each member's train and validation grid, stacked by :meth:`pack`)."""
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
        self.uses_mse = _uses_mse(template)
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
            **self._grids(data, members),
        )

    def _grids(self, data: dict[int, tuple[_Tensors, ...]], members: list[int]) -> dict:
        if self.obs_t is not None:
            return {}
        return {
            f: torch.stack([getattr(data[i][0], f) for i in members]) for f in ("obs_t", "query_t")
        }

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
            obs_t=None if pack.obs_t is None else pack.obs_t.index_select(0, sel),
            query_t=None if pack.query_t is None else pack.query_t.index_select(0, sel),
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

    # --- packed-model hook (ForecastModel.packed_losses / packed_forward) -------------------
    # The two places where the members' model is evaluated; the model's hook runs them (a
    # plain vmap by default, a model's own batched solve or random draws where it packs itself).

    def _hook_args(self, pack: _Pack) -> tuple:
        """The members' modules, their stacked tensors by name, the vmapped call, and the time
        grids: shared ``[T]`` or each member's own ``[M, T]`` (other systems)."""
        state = self._state(pack)

        def run(fn: Callable, *batched: torch.Tensor):
            call = _Call(self.base, fn)

            def one(s, *args):
                return functional_call(call, s, args)

            return vmap(one, randomness="error")(state, *batched)

        members = [self.models[m] for m in pack.members]
        own = {n.removeprefix("model."): t for n, t in state.items()}
        if pack.obs_t is None:
            return members, own, run, self.obs_t, self.query_t
        return members, own, run, pack.obs_t, pack.query_t

    def losses(self, pack: _Pack, obs_x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Each member's training loss on its batch ``[M]``."""
        members, state, run, obs_t, query_t = self._hook_args(pack)
        return self.base.packed_losses(members, state, run, obs_t, obs_x, query_t, target)

    def predict(self, pack: _Pack, obs_x: torch.Tensor) -> torch.Tensor:
        """Each member's prediction at its query times ``[M, B, T_q, D]``."""
        members, state, run, obs_t, query_t = self._hook_args(pack)
        return self.base.packed_forward(members, state, run, obs_t, obs_x, query_t)

    # --- end of the packed-model hook ------------------------------------------------------

    @torch.no_grad()
    def validate(self, pack: _Pack, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each member's validation loss and RMSE ``([M], [M])``, on the device, as
        :func:`tasks.training._validate` computes them for one cell (the loss of a model with its
        own objective: that objective averaged over the validation batches)."""
        n_val = pack.val_obs_x.shape[1]
        starts = range(0, n_val, batch_size)
        preds = torch.cat(
            [self.predict(pack, pack.val_obs_x[:, s : s + batch_size]) for s in starts], dim=1
        )
        mse = torch.mean((preds - pack.val_target) ** 2, dim=tuple(range(1, preds.dim())))
        if self.uses_mse:
            return mse, mse.sqrt()
        losses = [
            self.losses(
                pack, pack.val_obs_x[:, s : s + batch_size], pack.val_target[:, s : s + batch_size]
            )
            * min(batch_size, n_val - s)
            for s in starts
        ]
        return torch.stack(losses).sum(0) / n_val, mse.sqrt()

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
            active = pack.active.clone()
            norm = None
            if self.clip is not None:
                norms = torch.stack(
                    [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), 2, dim=1) for g in grads],
                    dim=1,
                )
                norm = torch.linalg.vector_norm(norms, 2, dim=1)
                coef = torch.clamp(self.clip / (norm + _CLIP_EPS), max=1.0)
                grads = [g * _expand(coef, g) for g in grads]
            ok = _record_step(pack, losses, norm, self.batch_no, batch)
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
        self.base.reset_nfe()
        self.base.count_nfe(nfe0)
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

    Neural Laplace packs: under ``vmap`` it runs its plain formulas instead of its fused
    decoder (:func:`nlmodels.accel.select`). Models that pack themselves
    (:meth:`~nlmodels.base.ForecastModel.packs_itself`: the Latent ODE with dopri5 or Euler,
    whose ELBO draws each member's sample from its own stream and whose adaptive solve gives
    each member a lane of its own) are packable. Otherwise not packable: models with their own
    objective, solvers other than Euler (adaptive ones have data-dependent step control; the
    batched Euler solve is the one that matches torchdiffeq's arithmetic), the adjoint method,
    recurrent layers other than a plain ``nn.GRU``/``nn.GRUCell`` (replaced by the same maths in
    plain ops), and whatever fails a vmapped forward and backward on two copies.
    """
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        return False
    if not model.packs_itself() and (
        not _uses_mse(model)
        or getattr(model, "solver", "euler") != "euler"
        or getattr(model, "adjoint", False)
    ):
        return False
    if any(isinstance(m, nn.RNNBase) and not _plain_gru(m) for m in model.modules()):
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
        packer.validate(pack, 2)
    except Exception:  # anything vmap cannot batch means: train one by one
        return False
    return True


def prefers_one_by_one(model: ForecastModel, device: torch.device | str) -> bool:
    """Whether a pack would give up fast paths that make the cells quicker one by one: Neural
    Laplace on the CPU, where its native kernels (or their torch twins) beat its plain formulas
    under ``vmap`` (``benchmarks/nl_packing.py``: packed ×5 about 5× slower per cell-epoch,
    float64, one thread). A default for choosing packs before anything is measured; exact
    either way (:func:`packable`)."""
    from nlmodels import NeuralLaplace

    return torch.device(device).type == "cpu" and isinstance(model, NeuralLaplace)


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


def _packable_grids(train_splits: Sequence[SplitData], val_splits: Sequence[SplitData]) -> bool:
    """Tensors of the same shapes in every member, one time grid ``[T]`` per member shared by
    its training and validation splits (the grids may differ between members: other systems)."""
    s0 = train_splits[0]

    def shapes(s: SplitData) -> tuple:
        return (
            np.shape(s.obs_x)[1:],
            np.shape(s.target)[1:],
            np.shape(s.obs_t),
            np.shape(s.query_t),
        )

    return all(
        np.ndim(tr.obs_t) == 1
        and np.ndim(tr.query_t) == 1
        and np.array_equal(tr.obs_t, va.obs_t)
        and np.array_equal(tr.query_t, va.query_t)
        and shapes(tr) == shapes(s0)
        and shapes(va) == shapes(s0)
        and len(tr.obs_x) == len(s0.obs_x)
        and len(va.obs_x) == len(val_splits[0].obs_x)
        for tr, va in zip(train_splits, val_splits, strict=True)
    )


def _shared_grids(splits: Sequence[SplitData]) -> bool:
    s0 = splits[0]
    return all(
        np.array_equal(s.obs_t, s0.obs_t) and np.array_equal(s.query_t, s0.query_t) for s in splits
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
    pack: bool = True,
) -> list[TrainResult | TrainingDiverged]:
    """Train ``models[i]`` on ``train_splits[i]`` with seed ``seeds[i]``, all in one batch.

    Each member's result (and the best-validation weights left in its module) is that of
    ``train(models[i], train_splits[i], val_splits[i], config, seed=seeds[i],
    label=labels[i])``; a member that diverges gets its :class:`TrainingDiverged` in its place
    of the returned list and leaves the others running. ``on_epoch(i, record)`` is called after
    each of member ``i``'s epochs. Setting ``stop`` raises :class:`TrainingInterrupted`.

    Members may come from different systems: their time grids are batched with them (a model
    that packs itself, :meth:`~nlmodels.base.ForecastModel.packs_itself`, is packed once per
    time grid instead). A single
    member, ``pack=False``, models that are not :func:`packable` or that differ in architecture,
    and splits whose shapes differ (or whose train and validation grids differ) are trained one
    by one by :func:`train`.
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
    args = (models, train_splits, val_splits, config, device, seeds, on_epoch, stop, progress)
    if (
        n < 2
        or not pack
        or not all(packable(m, device) for m in models)
        or not _same_layout(models)
        or not _packable_grids(train_splits, val_splits)
        or min(s.obs_x.shape[0] for s in (*train_splits, *val_splits)) == 0
    ):
        return _one_by_one(*args, labels)
    if models[0].packs_itself() and not _shared_grids(train_splits):
        # Its own batched solve needs one grid: one pack per grid (other systems).
        groups: dict[tuple[bytes, bytes], list[int]] = {}
        for i, s in enumerate(train_splits):
            key = (np.asarray(s.obs_t).tobytes(), np.asarray(s.query_t).tobytes())
            groups.setdefault(key, []).append(i)
        results: list[TrainResult | TrainingDiverged | None] = [None] * n
        for idx in groups.values():
            sub = train_packed(
                [models[i] for i in idx],
                [train_splits[i] for i in idx],
                [val_splits[i] for i in idx],
                config,
                device=device,
                seeds=[seeds[i] for i in idx],
                on_epoch=None if on_epoch is None else (lambda k, r, idx=idx: on_epoch(idx[k], r)),
                stop=stop,
                progress=progress,
                labels=[labels[i] for i in idx],
                graphs=graphs,
            )
            for i, r in zip(idx, sub, strict=True):
                results[i] = r
        return results  # type: ignore[return-value]
    cells = _PackedCells(models, train_splits, val_splits, config, device, seeds, labels, graphs)
    try:
        cells.probe()
    except Exception:  # e.g. members whose grids take different branches: one by one
        return _one_by_one(*args, labels)
    # The time budget is per cell: M packed cells hold one worker for up to M budgets, as they
    # would one after another, and spend packing's savings on more epochs.
    budget = None if config.max_train_seconds is None else config.max_train_seconds * n
    return _train_loop(
        cells,
        cells.n_train,
        config,
        list(labels),
        initial_states=[copy.deepcopy(m.state_dict()) for m in models],
        on_epoch=on_epoch,
        stop=stop,
        progress=progress,
        budget=budget,
    )


class _PackedCells:
    """The step function of a pack for :func:`tasks.training._train_loop`: the batched model's
    step (eager, or replayed from a CUDA graph), its per-member validation and best weights."""

    def __init__(self, models, train_splits, val_splits, config, device, seeds, labels, graphs):
        self.models, self.config, self.device = list(models), config, device
        self.labels, self.graphs_flag = list(labels), graphs
        # A model that packs itself (an adaptive solve: host reads) is not captured.
        self.use_graphs = (
            device.type == "cuda" and graphs is not False and not models[0].packs_itself()
        )
        self.graphs_used = False
        dtype = _DTYPES[config.dtype]
        self.data = {
            i: (
                _Tensors.of(train_splits[i], device, dtype),
                _Tensors.of(val_splits[i], device, dtype),
            )
            for i in range(len(models))
        }
        first = self.data[0][0]
        shared = _shared_grids(train_splits)
        self.packer = _Packer(
            self.models,
            device,
            config.grad_clip,
            config.lr,
            first.obs_t if shared else None,
            first.query_t if shared else None,
        )
        self.pack = self.packer.pack(list(range(len(models))), self.data)
        self.gens = [torch.Generator().manual_seed(s) for s in seeds]
        self.n_train = len(first)
        self.n_step = 0
        self.label = labels[0] if len(models) == 1 else f"{labels[0]} (+{len(models) - 1})"
        self.orders = torch.empty(0)

    @property
    def members(self) -> list[int]:
        return self.pack.members

    def probe(self) -> None:
        """One validation batch through the batched model: raises where the members cannot be
        batched (e.g. a check on the time grids that differs between members)."""
        self.packer.set_mode(self.pack, False)
        with torch.no_grad():
            self.packer.predict(self.pack, self.pack.val_obs_x[:, :1])

    def begin_epoch(self) -> None:
        self.packer.set_mode(self.pack, True)
        self.packer.base.reset_nfe()
        for m in self.pack.members:  # counts a model that packs itself keeps per member
            self.models[m].reset_nfe()
        self.orders = torch.stack(
            [
                torch.randperm(self.n_train, generator=self.gens[m]).to(self.device)
                for m in self.pack.members
            ]
        )
        self.pack.total.zero_()

    def train_step(self, b_i: int, start: int, batch: int) -> None:
        packer, pack = self.packer, self.pack
        self.n_step += 1
        adam = packer.adam_scalars(self.n_step)
        packer.batch_no.fill_(b_i)
        rows = self.orders[:, start : start + batch]
        if self.use_graphs:
            try:
                g = packer.graph(pack, batch)
            except Exception as e:
                if self.graphs_flag:
                    raise RuntimeError(
                        f"{self.label}: capturing the training step into a CUDA graph "
                        f"failed ({e}); use graphs=None or False for eager steps"
                    ) from e
                warnings.warn(
                    f"{self.label}: CUDA graph capture failed ({e}); eager steps",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self.use_graphs = False
            else:
                g.idx.copy_(rows)
                g.graph.replay()
                packer.base.count_nfe(g.nfe)
                self.graphs_used = True
                return
        packer.step(pack, rows, batch, adam)

    def end_epoch(self) -> _Readout:
        packer, pack = self.packer, self.pack
        nfe = packer.base.nfe
        nfes = [nfe + self.models[m].nfe for m in pack.members]
        packer.set_mode(pack, False)
        if len(pack.members) == 1:
            # A pack of one (a single cell on CUDA) validates through its own module: its fast
            # paths (cuDNN, the fused decoder) rather than the plain formulas under vmap.
            (m,) = pack.members
            packer.write_back(pack, 0)
            val_loss, val_rmse = _validate(self.models[m], self.data[m][1], self.config.batch_size)
        else:
            val_loss, val_rmse = packer.validate(pack, self.config.batch_size)
        return _read_epoch(pack, val_loss, val_rmse, nfes)

    def keep_best(self, j: int) -> dict:
        self.packer.write_back(self.pack, j)
        return copy.deepcopy(self.models[self.pack.members[j]].state_dict())

    def diverged(self, j: int) -> None:
        # As train() leaves a model that diverged: its weights at that moment, in training mode.
        self.packer.write_back(self.pack, j)
        self.models[self.pack.members[j]].train()

    def finish(self, j: int, best_state: dict, nfe: int) -> None:
        model = self.models[self.pack.members[j]]
        model.load_state_dict(best_state)
        model.eval()
        model.reset_nfe()
        model.count_nfe(nfe)

    def drop(self, keep: list[int]) -> None:
        self.pack = self.packer.compact(self.pack, keep)
        self.packer.graphs.clear()  # captured for the previous pack's tensors


def graphed_single(
    model: ForecastModel,
    train_split: SplitData,
    val_split: SplitData,
    config: TrainConfig,
    device: torch.device,
    seed: int,
    label: str,
) -> _PackedCells | None:
    """One cell on CUDA as a pack of one, its step captured into a CUDA graph (the arithmetic of
    its eager step); None where the model or its splits cannot be packed (trained eagerly)."""
    if device.type != "cuda" or model.packs_itself() or not packable(model, device):
        return None  # a model that packs itself is not captured: its own step, eagerly
    if not _packable_grids([train_split], [val_split]):
        return None
    return _PackedCells([model], [train_split], [val_split], config, device, [seed], [label], None)
