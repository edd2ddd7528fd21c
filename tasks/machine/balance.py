"""Which device each pack trains on under ``--device auto``: the plan that finishes first.

Each pack's probe says what one of its cell-epochs costs on the GPU and on one CPU core. Taking
the faster device pack by pack ignores that the GPU's packs run one after another (packs in
several lanes share it by time slices) while the CPU's spread over the workers: a model that is
several times faster per cell on the GPU can still finish sooner on a dozen idle cores. So the
packs start on their faster device, and then, one pack at a time, the move to the other device
that most shortens the plan's makespan (the later of the GPU's and the CPU workers' busy time,
:func:`busy_seconds`) is taken, until no move shortens it: local search in the spirit of the
list-scheduling heuristics for unrelated machines (Graham, 1969; Lenstra, Shmoys & Tardos,
1990). It starts from the per-pack choice, so the plan it returns is never longer than that one.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["GPU_LANES", "PackOption", "balance_devices", "busy_seconds"]

#: GPU packs training at once under ``--device auto`` (the other workers train CPU packs).
GPU_LANES = 2

#: Moves that shorten the makespan by less than this share are not taken (timing noise).
MIN_GAIN = 1e-3


def busy_seconds(
    packs: Iterable[tuple[str, float]], workers: int, lanes: int = GPU_LANES
) -> tuple[float, float]:
    """(GPU, CPU) busy seconds of ``packs`` (device, training seconds) run as
    ``tasks.engine.run_cells`` runs them on ``workers`` workers: the GPU's packs add up (packs
    in several lanes share one GPU by time slices, as the ledger's CUDA runs measured), the
    CPU's packs longest first, each on the earliest free worker of those the GPU lanes leave."""
    packs = list(packs)
    gpu = [s for d, s in packs if d == "cuda"]
    cpu = sorted((s for d, s in packs if d != "cuda"), reverse=True)
    used_lanes = min(lanes, len(gpu), max(workers - 1, 1))
    slots = [0.0] * max(1, workers - used_lanes if cpu else workers)
    for s in cpu:
        heapq.heapreplace(slots, slots[0] + s)
    return sum(gpu), max(slots) if cpu else 0.0


@dataclass(frozen=True)
class PackOption:
    """One pack's training seconds on either side: ``cuda`` the whole pack on the GPU, ``cpu``
    the seconds of each piece it trains in on the CPU (the whole pack, or one piece per cell
    where it is split to spread over the workers)."""

    cuda: float
    cpu: tuple[float, ...]


def _items(options: Sequence[PackOption], where: Sequence[str]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for o, d in zip(options, where, strict=True):
        out += [("cuda", o.cuda)] if d == "cuda" else [("cpu", s) for s in o.cpu]
    return out


def _makespan(options: Sequence[PackOption], where: Sequence[str], workers: int, lanes: int):
    return max(busy_seconds(_items(options, where), workers, lanes))


def balance_devices(
    options: Sequence[PackOption], start: Sequence[str], workers: int, lanes: int = GPU_LANES
) -> list[str]:
    """``cuda``/``cpu`` for each pack, from ``start`` (each pack's faster device) on ``workers``
    workers of which ``lanes`` may train GPU packs (see the module's docstring)."""
    where = list(start)
    best = _makespan(options, where, workers, lanes)
    while True:
        moves = []
        for i in range(len(where)):
            flipped = [*where[:i], "cpu" if where[i] == "cuda" else "cuda", *where[i + 1 :]]
            moves.append((_makespan(options, flipped, workers, lanes), i, flipped))
        if not moves:
            return where
        span, _, flipped = min(moves, key=lambda m: m[:2])
        if span >= best * (1 - MIN_GAIN):
            return where
        best, where = span, flipped
