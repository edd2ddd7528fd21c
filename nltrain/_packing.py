"""Packed training: cells of one model whose tensors have the same shapes (seeds, and systems
of the same dimensions), trained together as one batched model.

The members' parameters are stacked along a leading ensemble dimension and one vectorised step
(``torch.func.vmap`` over ``functional_call``) trains them all; members whose time grids differ
(other systems) get their own grids through the same ``vmap``. Models run their plain formulas
under ``vmap`` (Neural Laplace: :func:`nlmodels.accel.select`; ``nn.GRU`` and ``nn.GRUCell`` are
swapped for the same maths in plain tensor ops).

Each member keeps everything :func:`nltrain.train` gives a cell on its own: its initial
weights, its shuffling (a private ``torch.Generator`` seeded with its seed), Adam with its
own moments, gradient-norm clipping over its own parameters, its validation, early stopping and
best-validation weights, and a divergence that ends only that member. A member's result is its
unpacked run's, bit for bit, whatever it was packed with and wherever it sits in the pack: a
single cell the engine would pack trains as a pack of one (:func:`nltrain.train`),
members always get their own time grids, and a batched product gives each member its own
product's bytes: by definition under the portable CPU kernels (the default), and under torch's
(MKL in its strict reproducible mode, :mod:`nlmodels.numerics`) by computing a pack's
matrix–vector products (1-D systems) member by member (:mod:`nltrain._member_products`).

A member that stopped is frozen by ``torch.where`` masks (a diverged member's values may be NaN,
and NaN·0 is NaN) until the end of the epoch, then dropped from the pack. The epochs, stopping
rules and best weights are those of :func:`nltrain.train`: one loop drives both.

On CUDA a training step of fixed shape (Euler solves, flows: no data-dependent control flow) is
captured once into a CUDA graph and replayed (one graph per batch size, so the last short batch
is trained too): static index, step-size and batch-number buffers, divergence flags and loss
sums kept on the device, one host read per epoch.

Layout: :mod:`nltrain._packed_gru` (the plain-op GRU), :mod:`nltrain._packer` (the batched model,
its step and its graph capture), :mod:`nltrain._packed_cells` (a pack as the training loop's step
function, and :func:`packable`); this module chooses between a pack and one cell at a time.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from datasets import SplitData
from nlmodels import ForecastModel, require_numerics
from nlmodels.numerics import mkl_position_independent
from nltrain._config import TrainConfig
from nltrain._loop import LoopOptions, TrainingDiverged, TrainResult, train_loop
from nltrain._packed_cells import (
    PackedCells,
    packable,
    packable_grids,
    prefers_one_by_one,
    shared_grids,
)
from nltrain._packed_gru import PlainGRU, PlainGRUCell
from nltrain._steps import DTYPES
from nltrain._training import step_function

__all__ = [
    "PlainGRU",
    "PlainGRUCell",
    "packable",
    "prefers_one_by_one",
    "train_packed",
]


T = TypeVar("T")

#: ``train_packed``'s options unless given: each member labelled ``train``, no callback.
_DEFAULT = LoopOptions()


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


def _one_by_one(
    models, train_splits, val_splits, config, device, seeds, options: LoopOptions
) -> list[TrainResult | TrainingDiverged]:
    """Each member trained alone, as :func:`train` trains it (its own step and budget)."""
    results: list[TrainResult | TrainingDiverged] = []
    budget = _share(options.budget, 1, len(models))
    for i, model in enumerate(models):
        label = options.labels[i]
        step = step_function(
            model, train_splits[i], val_splits[i], config, device=device, seed=seeds[i], label=label
        )
        alone = replace(
            options,
            labels=(label,),
            on_epoch=_for_members(options.on_epoch, [i]),
            on_resume=_for_members(options.on_resume, [i]),
            budget=budget,
        )
        results += train_loop(step, config, alone)
    return results


def _for_members(hook: Callable[[int, T], None] | None, idx: Sequence[int]):
    """A per-member hook of the whole call (``on_epoch``, ``on_resume``: member index first),
    for a loop over its members ``idx``."""
    return None if hook is None else (lambda k, value: hook(idx[k], value))


def _share(budget: float | None, members: int, of: int) -> float | None:
    """``members`` cells' share of a budget set for ``of`` (None: each its own
    ``max_train_seconds``)."""
    return None if budget is None else budget * members / of


def train_packed(
    models: Sequence[ForecastModel],
    train_splits: Sequence[SplitData],
    val_splits: Sequence[SplitData],
    config: TrainConfig,
    *,
    device: torch.device | str = "cpu",
    seeds: Sequence[int],
    options: LoopOptions = _DEFAULT,
    graphs: bool | None = None,
    pack: bool = True,
) -> list[TrainResult | TrainingDiverged]:
    """Train ``models[i]`` on ``train_splits[i]`` with seed ``seeds[i]``, all in one batch.

    Each member's result (and the best-validation weights left in its module) is that of
    ``train(models[i], train_splits[i], val_splits[i], config, seed=seeds[i],
    label=options.labels[i])``; a member that diverges gets its :class:`TrainingDiverged` in
    its place of the returned list and leaves the others running.

    ``options`` (:class:`LoopOptions`): ``labels``, one per model (the default: ``train``
    each); ``on_epoch(i, record)`` after each of member ``i``'s epochs; setting ``stop`` raises
    :class:`TrainingInterrupted`; ``progress``; ``budget``, the wall-clock seconds of the whole
    call (None: ``config.max_train_seconds`` per cell, below; a member trained alone gets its
    share).

    Members may come from different systems: their time grids are batched with them (a model
    that :meth:`~nlmodels.base.ForecastModel.packs_itself` is packed once per time grid). A
    single member, ``pack=False``, models that are not :func:`packable` or that differ in
    architecture, and splits whose shapes differ are trained one by one by :func:`train`.
    ``max_train_seconds`` is per cell: a pack of ``n`` trains for up to ``n`` times it, as
    ``n`` cells one after another would (spending packing's savings on more epochs).
    ``graphs``: capture the training step into a CUDA graph (``None``: on CUDA, falling back
    to eager steps if the capture fails; ``True`` makes a failed capture an error).
    """
    require_numerics()
    labels = _check_members(models, train_splits, val_splits, seeds, options.labels)
    options = replace(options, labels=labels)
    device = torch.device(device)
    if graphs and device.type != "cuda":
        raise ValueError(f"graphs=True needs a CUDA device, got {device}")
    for model in models:
        model.to(device=device, dtype=DTYPES[config.dtype])
    args = (models, train_splits, val_splits, config, device, seeds, options)
    if not pack or not _can_pack(models, train_splits, val_splits, device):
        return _one_by_one(*args)
    if models[0].packs_itself() and not shared_grids(train_splits):
        # Its own batched solve needs one grid: one pack per grid (other systems).
        return _pack_per_time_grid(*args, graphs)
    _warn_mkl(device)
    cells = PackedCells(models, train_splits, val_splits, config, device, seeds, labels, graphs)
    try:
        cells.probe()
    except Exception:  # e.g. members whose grids take different branches: one by one
        return _one_by_one(*args)
    if options.budget is None and config.max_train_seconds is not None:
        options = replace(options, budget=config.max_train_seconds * len(models))
    return train_loop(cells, config, options)


def _warn_mkl(device: torch.device) -> None:
    if device.type == "cpu" and not mkl_position_independent():
        warnings.warn(
            "MKL started before nlmodels set MKL_CBWR=AUTO,STRICT: a packed member's bytes may "
            "depend on its position in the pack (import nlmodels before any matrix product)",
            RuntimeWarning,
            stacklevel=3,
        )


def _check_members(models, train_splits, val_splits, seeds, labels) -> tuple[str, ...]:
    """The members' labels (``train`` each for the default labels), after checking that every
    model has its splits, seed and label."""
    n = len(models)
    if not (len(train_splits) == len(val_splits) == len(seeds) == n):
        raise ValueError(
            f"train_packed needs one train split, val split and seed per model; got {n} "
            f"models, {len(train_splits)} train splits, {len(val_splits)} val splits and "
            f"{len(seeds)} seeds"
        )
    if labels == _DEFAULT.labels:
        return labels * n
    if len(labels) != n:
        raise ValueError(f"labels has {len(labels)} entries for {n} models")
    return tuple(labels)


def _can_pack(models, train_splits, val_splits, device: torch.device) -> bool:
    """Several :func:`packable` models of one layout, on splits of one shape, none empty."""
    return (
        len(models) >= 2
        and all(packable(m, device) for m in models)
        and _same_layout(models)
        and packable_grids(train_splits, val_splits)
        and min(s.obs_x.shape[0] for s in (*train_splits, *val_splits)) > 0
    )


def _pack_per_time_grid(
    models, train_splits, val_splits, config, device, seeds, options: LoopOptions, graphs
) -> list[TrainResult | TrainingDiverged]:
    """:func:`train_packed` once per group of members that share their time grids."""
    groups: dict[tuple[bytes, bytes], list[int]] = {}
    for i, s in enumerate(train_splits):
        key = (np.asarray(s.obs_t).tobytes(), np.asarray(s.query_t).tobytes())
        groups.setdefault(key, []).append(i)
    results: dict[int, TrainResult | TrainingDiverged] = {}
    for idx in groups.values():
        sub = train_packed(
            [models[i] for i in idx],
            [train_splits[i] for i in idx],
            [val_splits[i] for i in idx],
            config,
            device=device,
            seeds=[seeds[i] for i in idx],
            options=replace(
                options,
                labels=tuple(options.labels[i] for i in idx),
                on_epoch=_for_members(options.on_epoch, idx),
                on_resume=_for_members(options.on_resume, idx),
                budget=_share(options.budget, len(idx), len(models)),
            ),
            graphs=graphs,
        )
        for i, r in zip(idx, sub, strict=True):
            results[i] = r
    return [results[i] for i in range(len(models))]
