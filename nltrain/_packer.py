"""The batched model of a pack: the members' parameters stacked along a leading dimension, one
vectorised forward (``torch.func.vmap`` over ``functional_call``) and one training step with
per-member clipping and masked Adam, eager or captured into a CUDA graph (see
:mod:`nltrain._packing` for what packing guarantees)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.utils import parametrize

from nlmodels import ForecastModel
from nlmodels.base import recorded_host_bools
from nltrain._member_products import MemberProducts
from nltrain._packed_gru import replace_gru_modules
from nltrain._steps import Tensors, record_step, uses_mse

__all__ = ["Graph", "Pack", "Packer"]

# torch.optim.Adam's defaults (Kingma & Ba, 2015), as train() uses them.
_BETA1, _BETA2, _EPS = 0.9, 0.999, 1e-8
# clip_grad_norm_'s guard against division by zero.
_CLIP_EPS = 1e-6


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
    # the ModuleDict that parametrize.register_parametrization adds
    ((tname, plist),) = cast(nn.ModuleDict, module.parametrizations).items()
    original = cast(nn.Parameter, plist.original)  # a model's parametrised tensor: a parameter
    module.__class__ = module.__class__.__bases__[0]
    del module._modules["parametrizations"]
    module.register_parameter(tname, original)


@dataclass
class Pack:
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

    def named_state(self) -> dict[str, torch.Tensor]:
        """Every tensor a step changes, by name (a checkpoint's, in :meth:`mutable`'s order)."""
        named = {
            f"{group}.{n}": t
            for group in ("params", "buffers", "exp_avg", "exp_avg_sq")
            for n, t in getattr(self, group).items()
        }
        flags = ("active", "total", "div_kind", "div_value", "div_batch")
        return named | {f: getattr(self, f) for f in flags}

    def mutable(self) -> list[torch.Tensor]:
        return list(self.named_state().values())


@dataclass
class Graph:
    graph: torch.cuda.CUDAGraph
    idx: torch.Tensor
    nfe: int


class Packer:
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
        replace_gru_modules(self.base)
        self.base.to("meta")
        self.uses_mse = uses_mse(template)
        self.graphs: dict[tuple[tuple[int, ...], int], Graph] = {}
        # On CUDA, Adam's step size lives in device scalars that a captured step reads (eager
        # steps read them too, so that graphs and eager steps compute the same).
        self.device_scalars = device.type == "cuda"
        self.neg_step = torch.zeros((), dtype=torch.float64, device=device)
        self.bc2_sqrt = torch.zeros((), dtype=torch.float64, device=device)
        self.batch_no = torch.zeros((), dtype=torch.long, device=device)
        # A member's matrix-vector products as its pack of one computes them (1-D systems).
        self.products = MemberProducts(device)

    # ----- state -----------------------------------------------------------------------------

    def _named(self, m: int) -> dict[str, torch.Tensor]:
        model = self.models[m]
        return {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def pack(self, members: list[int], data: dict[int, tuple[Tensors, Tensors]]) -> Pack:
        named = [self._named(m) for m in members]

        def stack(name: str) -> torch.Tensor:
            return torch.stack([n[name].detach() for n in named]).clone()

        params = {n: stack(n).requires_grad_(True) for n in self.param_names + self.original_names}
        m = len(members)
        zeros = {n: torch.zeros_like(p) for n, p in params.items()}
        return Pack(
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

    def _grids(self, data: Mapping[int, tuple[Tensors, ...]], members: list[int]) -> dict:
        if self.obs_t is not None:
            return {}
        return {
            f: torch.stack([getattr(data[i][0], f) for i in members]) for f in ("obs_t", "query_t")
        }

    def compact(self, pack: Pack, keep: list[int]) -> Pack:
        """The pack of the members at positions ``keep`` (Adam moments carried over)."""
        sel = torch.tensor(keep, dtype=torch.long, device=self.device)

        def take(d: dict[str, torch.Tensor], grad: bool = False) -> dict[str, torch.Tensor]:
            return {n: t.detach().index_select(0, sel).requires_grad_(grad) for n, t in d.items()}

        m = len(keep)
        return Pack(
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
    def write_back(self, pack: Pack, j: int) -> None:
        """Copy member ``pack.members[j]``'s current tensors into its own module."""
        named = self._named(pack.members[j])
        for n, t in (*pack.params.items(), *pack.buffers.items()):
            named[n].copy_(t[j])

    def set_mode(self, pack: Pack, training: bool) -> None:
        self.base.train(training)
        for m in pack.members:
            self.models[m].train(training)

    # ----- the batched model -----------------------------------------------------------------

    def _state(self, pack: Pack) -> dict[str, torch.Tensor]:
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

    def _hook_args(self, pack: Pack) -> tuple:
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

    def losses(self, pack: Pack, obs_x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Each member's training loss on its batch ``[M]``."""
        members, state, run, obs_t, query_t = self._hook_args(pack)
        return self.base.packed_losses(members, state, run, obs_t, obs_x, query_t, target)

    def predict(self, pack: Pack, obs_x: torch.Tensor) -> torch.Tensor:
        """Each member's prediction at its query times ``[M, B, T_q, D]``."""
        members, state, run, obs_t, query_t = self._hook_args(pack)
        return self.base.packed_forward(members, state, run, obs_t, obs_x, query_t)

    # --- end of the packed-model hook ------------------------------------------------------

    @torch.no_grad()
    def validate(self, pack: Pack, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each member's validation loss and RMSE ``([M], [M])``, on the device, as
        :func:`nltrain._steps.validate` computes them for one cell (the loss of a model with its
        own objective: that objective averaged over the validation batches)."""
        with self.products.scope(("validate", batch_size), len(pack.members)):
            return self._validate(pack, batch_size)

    def _validate(self, pack: Pack, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
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

    def step(self, pack: Pack, idx: torch.Tensor, batch: int, adam: tuple) -> None:
        """Forward, backward, per-member clipping and masked Adam for the batch rows ``idx``.

        Reads no tensor value on the host, so that it can be captured into a CUDA graph.
        ``adam`` is (−step size, √bias correction 2) as floats (CPU) or device scalars (CUDA).
        """
        obs_x = pack.obs_x[pack.rows, idx]
        target = pack.target[pack.rows, idx]
        saved = self._saved_buffers(pack)
        names = list(pack.params)
        with self.products.scope(("step", batch), len(pack.members)):
            losses = self.losses(pack, obs_x, target)
            grads: Sequence[torch.Tensor] = torch.autograd.grad(
                losses.sum(), [pack.params[n] for n in names]
            )
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
            ok = record_step(pack, losses, norm, self.batch_no, batch)
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

    def _saved_buffers(self, pack: Pack) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Buffers a forward pass updates (spectral norm's power iteration) stay frozen for
        # members that stopped.
        pairs = [(b, b.clone()) for b in pack.buffers.values()]
        for m in pack.members:
            named = dict(self.models[m].named_buffers())
            pairs += [(named[n], named[n].clone()) for n in self.hoisted_buffer_names]
        return pairs

    def _restore_inactive(self, pack: Pack, saved: list, active: torch.Tensor) -> None:
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

    def graph(self, pack: Pack, batch: int) -> Graph:
        key = (tuple(pack.members), batch)
        if key not in self.graphs:
            self.graphs[key] = self._capture(pack, batch)
        return self.graphs[key]

    def _capture(self, pack: Pack, batch: int) -> Graph:
        idx = torch.arange(batch, device=self.device).expand(len(pack.members), -1).clone()
        state = pack.mutable() + [b for m in pack.members for b in self.models[m].buffers()]
        snapshot = [t.detach().clone() for t in state]
        nfe0 = self.base.nfe
        adam = (self.neg_step, self.bc2_sqrt)
        # The members' own generators go back to where they were too, then advance by replays.
        gens = self.base.graph_generators([self.models[m] for m in pack.members])
        gen_states = [g.get_state() for g in gens]
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
        for gen, gen_state in zip(gens, gen_states):
            gen.set_state(gen_state)
        graph = torch.cuda.CUDAGraph()  # a private memory pool: graphs share no scratch memory
        for gen in gens:
            # each replay draws the next numbers (an older torch cannot: eager steps instead)
            register = getattr(graph, "register_generator_state", None)
            if register is None:
                raise RuntimeError("this torch cannot replay a generator of its own in a graph")
            register(gen)
        with recorded_host_bools(tape, replay=True), torch.cuda.graph(graph):
            self.step(pack, idx, batch, adam)
        self.base.reset_nfe()
        self.base.count_nfe(nfe0)
        return Graph(graph, idx, nfe)


def _expand(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(-1, *([1] * (like.dim() - 1)))
