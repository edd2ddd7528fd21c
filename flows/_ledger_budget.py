"""How much of the ledger fits a time limit (``nllab ledger run --max-minutes``): the
expected seconds of a group, from the ledger's own records or this machine's measurement of
the engine's packs, the parts of a group that fit, and the deadline that stops a run."""

from __future__ import annotations

import statistics
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flows.ledger import LedgerGroup
    from tasks.engine import PackEstimate
    from tasks.ledger import LedgerRecord

__all__ = [
    "ESTIMATE_MARGIN",
    "FIXED_SECONDS",
    "deadline",
    "expected_seconds",
    "fitting_parts",
    "needed_seconds",
]

#: Seconds a group's benchmark spends besides training: Prefect's server, the plan and its
#: probes, reading the data sets, the test evaluation and the runs' last writes.
FIXED_SECONDS = 45.0
#: A measured estimate is trusted to this factor (probes time two epochs of one batch).
ESTIMATE_MARGIN = 1.2


def fitting_parts(
    group: LedgerGroup, estimates: Sequence[PackEstimate], left: float, workers: int
) -> list[tuple[LedgerGroup, float]]:
    """The parts of ``group`` to train in ``left`` seconds, in order, each with the seconds it
    is expected to need, given the engine's packs of it as measured on this machine
    (:func:`tasks.engine.estimate_packs`): the whole packs expected to fit (in the engine's
    order, :data:`FIXED_SECONDS` and :data:`ESTIMATE_MARGIN` allowed for), as the largest
    systems × seeds they hold (:meth:`LedgerGroup.largest_part`). When they are all CUDA packs,
    one part per pack, trained one after another: packs in GPU lanes share the GPU by time
    slices, so one after another they take as long, and each pack's cells are recorded as it
    ends rather than all at the end. Empty: nothing is expected to fit."""
    chosen: list[PackEstimate] = []
    for e in estimates:  # a pack that does not fit leaves room for the next ones
        if needed_seconds([*chosen, e], workers) <= left:
            chosen.append(e)
    if not chosen:
        return []
    if len(chosen) > 1 and all(e.device == "cuda" for e in chosen):
        one_by_one = [
            (group.largest_part(_pairs([e])), needed_seconds([e], workers)) for e in chosen
        ]
        if all(p is not None and p.size == len(e.cells) for (p, _), e in zip(one_by_one, chosen)):
            return one_by_one  # type: ignore[return-value]
    if len(chosen) == len(estimates):
        return [(group, needed_seconds(chosen, workers))]
    part = group.largest_part(_pairs(chosen))
    return [] if part is None else [(part, needed_seconds(chosen, workers))]


def _pairs(estimates: Sequence[PackEstimate]) -> set[tuple[str, int]]:
    return {(c.system, c.seed) for e in estimates for c in e.cells}


def needed_seconds(estimates: Sequence[PackEstimate], workers: int) -> float:
    """Seconds the packs are expected to need: their training (:func:`tasks.engine.
    busy_seconds`) with the margin, and the fixed cost of each benchmark (one for them all;
    one per pack when they are all CUDA packs, which :func:`fitting_parts` trains one by one)."""
    from tasks.engine import busy_seconds

    training = max(busy_seconds(((e.device, e.seconds) for e in estimates), workers))
    runs = len(estimates) if all(e.device == "cuda" for e in estimates) else 1
    return runs * FIXED_SECONDS + ESTIMATE_MARGIN * training


@contextmanager
def deadline(
    seconds: float | None, stop: threading.Event, fired: threading.Event
) -> Iterator[None]:
    """Set ``fired`` and ``stop`` after ``seconds`` (the engine's stop path: running cells end
    KILLED at their next batch, finished ones stay)."""
    if seconds is None:
        yield
        return

    def fire() -> None:
        fired.set()
        stop.set()

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def expected_seconds(
    group: LedgerGroup,
    records: Sequence[LedgerRecord],
    device: str,
    hardware: str | None = None,
) -> float | None:
    """The median training seconds of the ledger's records of ``group``'s method (and
    ablation) on this kind of device (a pack's members train at once: a group takes about one
    member's time); of those made on ``hardware`` (the processor's name) where there are any,
    since two CPUs of one kind can differ twofold; None without such records."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    usable = [
        r
        for r in records
        if r.method == group.method
        and r.ablation == group.ablation
        and r.train_seconds is not None
        and (r.device or "cpu").startswith(kind)
    ]
    here = [r for r in usable if hardware is not None and r.hardware == hardware]
    seconds = [r.train_seconds for r in here or usable]
    return statistics.median(seconds) if seconds else None
