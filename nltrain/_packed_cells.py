"""The step function of a pack for the training loop (:func:`nltrain.train_loop`):
the batched model's step (eager, or replayed from a CUDA graph), each member's validation and best
weights; and which models and splits can be packed (:func:`packable`)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from datasets import SplitData
from nlmodels import ForecastModel
from nltrain._checkpoints import generator_states, restore_generators
from nltrain._config import TrainConfig
from nltrain._packed_gru import is_plain_gru
from nltrain._packer import Packer
from nltrain._steps import DTYPES, Readout, Tensors, read_epoch, uses_mse, validate

__all__ = [
    "ADJOINT_PACKS_ON",
    "PackedCells",
    "pack_of_one",
    "packable",
    "packable_grids",
    "prefers_one_by_one",
    "shared_grids",
]


#: The devices where a model trained through the adjoint of an Euler solve packs (see
#: :func:`packable`). Not the CPU: there the engine trains such cells one by one, and the
#: numerics fingerprints' canary trains its pack of two seeds through ``train_packed``, whose
#: bytes must stay those of the eager step the recorded cells ran (tests add the CPU to run the
#: packed path on its CPU twin).
ADJOINT_PACKS_ON: tuple[str, ...] = ("cuda",)


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
    batched Euler solve is the one that matches torchdiffeq's arithmetic), the adjoint method
    (but of an Euler solve, below), recurrent layers other than a plain ``nn.GRU`` or
    ``nn.GRUCell`` (replaced by the same maths in plain ops), and whatever fails a vmapped
    forward and backward on two copies.

    The adjoint method of an Euler solve (the reference protocol's NODE and ANODE) packs on the
    devices of :data:`ADJOINT_PACKS_ON` only: inside a pack it runs torchdiffeq's arithmetic in
    batchable ops (:func:`nlmodels.baselines._euler.euler_adjoint`), so that a CUDA pack
    trains many such cells at once, while on the CPU those cells keep the eager step they were
    recorded with, one cell at a time (torchdiffeq's ``odeint_adjoint``, whose bytes
    :func:`nlmodels.baselines._euler.euler_adjoint_eager` computes with less work).
    """
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        return False
    if not model.packs_itself() and (
        not uses_mse(model)
        or getattr(model, "solver", "euler") != "euler"
        or (getattr(model, "adjoint", False) and device.type not in ADJOINT_PACKS_ON)
    ):
        return False
    if any(isinstance(m, nn.RNNBase) and not is_plain_gru(m) for m in model.modules()):
        return False
    if not isinstance(getattr(model, "state_dim", None), int):
        return False
    try:
        copies = [copy.deepcopy(model).to(dtype=torch.float64, device="cpu") for _ in range(2)]
        ot, qt, x, y = _probe_data(model)
        packer = Packer(copies, torch.device("cpu"), 1.0, 1e-3, ot, qt)
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
    """Whether the engine trains this model's cells one by one on ``device``, each on its own
    eager step, never packed (so that a cell's bytes are those of that step):

    * Neural Laplace on the CPU, where its native kernels (or their torch twins) beat its plain
      formulas under ``vmap`` (``benchmarks/nl_packing.py``: packed ×5 about 5× slower per
      cell-epoch, float64, one thread);
    * the Latent ODE on the CPU: its eager step (a lone dopri5 lane deciding on the host) is
      what its published results were trained with; a pack of its seeds gains about 1.4× on the
      CPU (``benchmarks/throughput.py``) but would give each cell other bytes (quick profile,
      test RMSE up to 9 % apart after 45 epochs).

    Elsewhere a packable cell trains as a pack of one when alone (:func:`pack_of_one`)."""
    from nlmodels import NeuralLaplace
    from nlmodels.baselines import LatentODE

    return torch.device(device).type == "cpu" and isinstance(model, NeuralLaplace | LatentODE)


def _probe_tensors(ot, x, qt, y) -> Tensors:
    return Tensors(ot, x, qt, y)


def packable_grids(train_splits: Sequence[SplitData], val_splits: Sequence[SplitData]) -> bool:
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


def shared_grids(splits: Sequence[SplitData]) -> bool:
    s0 = splits[0]
    return all(
        np.array_equal(s.obs_t, s0.obs_t) and np.array_equal(s.query_t, s0.query_t) for s in splits
    )


class PackedCells:
    """The step function of a pack for :func:`nltrain.train_loop`: the batched model's
    step (eager, or replayed from a CUDA graph), its per-member validation and best weights."""

    def __init__(self, models, train_splits, val_splits, config, device, seeds, labels, graphs):
        self.models, self.config, self.device = list(models), config, device
        self.labels, self.graphs_flag = list(labels), graphs
        # members share their settings (nltrain._packing packs only equal layouts)
        self.selection_metric = models[0].selection_metric
        # A model that packs itself is captured where it says so (no host reads while captured).
        self.use_graphs = (
            device.type == "cuda" and graphs is not False and models[0].captures_packed()
        )
        self.graphs_used = False
        dtype = DTYPES[config.dtype]
        self.data = {
            i: (
                Tensors.of(train_splits[i], device, dtype),
                Tensors.of(val_splits[i], device, dtype),
            )
            for i in range(len(models))
        }
        first = self.data[0][0]
        # Each member's own grids ([M, T]) even where they are the same: under vmap a shared
        # grid is an unbatched operand, and some kernels then reduce in another order (the
        # Neural Flows' encoder), so that a member's bytes would depend on its mates' grids. A
        # model that packs itself is packed once per grid (its batched solve needs one).
        shared = models[0].packs_itself() and shared_grids(train_splits)
        self.packer = Packer(
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

    def end_epoch(self) -> Readout:
        packer, pack = self.packer, self.pack
        overrun = packer.base.graph_epoch_end([self.models[m] for m in pack.members])
        if overrun is not None:
            raise RuntimeError(f"{self.label}: {overrun}")
        if packer.base.graph_recapture():
            packer.graphs.clear()
        nfe = packer.base.nfe
        nfes = [nfe + self.models[m].nfe for m in pack.members]
        packer.set_mode(pack, False)
        if len(pack.members) == 1 and self.device.type == "cuda":
            # A pack of one on CUDA validates through its own module: its fast paths (cuDNN,
            # the fused decoder) rather than the plain formulas under vmap. On the CPU it
            # validates as every pack does, so that its history is that of any pack it joins.
            (m,) = pack.members
            packer.write_back(pack, 0)
            val_loss, val_rmse = validate(self.models[m], self.data[m][1], self.config.batch_size)
        else:
            val_loss, val_rmse = packer.validate(pack, self.config.batch_size)
        return read_epoch(pack, val_loss, val_rmse, nfes)

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

    def state(self) -> dict:
        return {
            "members": list(self.pack.members),
            "n_step": self.n_step,
            "pack": {n: t.detach() for n, t in self.pack.named_state().items()},
            # the members' own modules too: what they update in place outside the pack (a
            # spectral norm's power iteration) and their buffers
            "models": [m.state_dict() for m in self.models],
            "shuffle": [g.get_state() for g in self.gens],
            "streams": [generator_states(m) for m in self.models],
        }

    @torch.no_grad()
    def restore(self, state: dict) -> None:
        if state["members"] != self.pack.members:
            raise ValueError(
                f"{self.label}: the checkpoint is of members {state['members']}, "
                f"this pack trains {self.pack.members}"
            )
        for model, saved in zip(self.models, state["models"], strict=True):
            model.load_state_dict(saved)
        for name, t in self.pack.named_state().items():
            t.copy_(state["pack"][name])
        self.n_step = state["n_step"]
        for gen, saved in zip(self.gens, state["shuffle"], strict=True):
            gen.set_state(saved)
        for model, saved in zip(self.models, state["streams"], strict=True):
            restore_generators(model, saved)


def pack_of_one(
    model: ForecastModel,
    train_split: SplitData,
    val_split: SplitData,
    config: TrainConfig,
    device: torch.device,
    seed: int,
    label: str,
) -> PackedCells | None:
    """One cell as a pack of one: the arithmetic of every pack it could join (the batched
    kernels under ``vmap``, the pack's clipping and Adam), so that a cell trained alone and
    the same cell trained in any pack give the same bytes (on CUDA its step is captured into a
    CUDA graph where the model :meth:`~nlmodels.base.ForecastModel.captures_packed`). None
    where the model or its splits cannot be packed (trained eagerly)."""
    if not packable(model, device) or not packable_grids([train_split], [val_split]):
        return None
    return PackedCells([model], [train_split], [val_split], config, device, [seed], [label], None)
