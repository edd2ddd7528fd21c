"""How much of the ledger fits a time limit (``nllab ledger run --max-minutes``): the
expected seconds of a group, from the ledger's own records or this machine's measurement of
the engine's packs, the parts of a group that fit, and the deadline that stops a run."""

from __future__ import annotations

import statistics
import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flows.ledger.groups import LedgerGroup
    from tasks.engine import PackEstimate
    from tasks.ledger import LedgerRecord

__all__ = [
    "ESTIMATE_MARGIN",
    "FIXED_SECONDS",
    "RECENT_RECORDS",
    "deadline",
    "expected_seconds",
    "fitting_parts",
    "needed_seconds",
    "speed_ratios",
]

#: Seconds a group's benchmark spends besides training: Prefect's server, the plan and its
#: probes, reading the data sets, the test evaluation and the runs' last writes.
FIXED_SECONDS = 45.0
#: A measured estimate is trusted to this factor (probes time two epochs of one batch).
ESTIMATE_MARGIN = 1.2
#: How many of the newest records of a kind a cell's estimate takes the median of: the ledger
#: file is appended as cells finish, so the newest say how fast today's code trains (a faster
#: step, :func:`nlmodels.baselines._euler.euler_adjoint_eager`, leaves slower records behind).
RECENT_RECORDS = 5


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
    packs: Sequence[Sequence[str]],
    method: str,
    ablation: str,
    records: Sequence[LedgerRecord],
    device: str,
    hardware: str | None = None,
    workers: int = 1,
    *,
    alike: Collection[str] = (),
) -> float | None:
    """The seconds a benchmark of ``method`` (and ``ablation``) is expected to take on this
    kind of device, from the ledger's records, given the packs the engine trains it in (the
    systems of each; one cell per pack for a model that trains one by one) and ``workers``:
    each pack takes as long as its slowest cell's estimate (a pack's members train at once, and
    a packed record holds its pack's time), and the packs spread over the workers as the engine
    runs them (:func:`tasks.machine.balance.busy_seconds`), plus the benchmark's fixed cost
    (:data:`FIXED_SECONDS`). None where some cell has no estimate (no record of the method on
    this kind of device).

    A cell's estimate is the median training time (:attr:`~tasks.ledger.LedgerRecord.
    timed_seconds`: on the CPU, what other work took from a run left out where its record says) of
    the newest :data:`RECENT_RECORDS` records of its system on ``hardware`` (the processor's name:
    two CPUs of one kind can differ twofold), else of every system on it, else of its system on any
    processor, else of every system; another processor's records count at this one's speed where
    both recorded some cells (:func:`speed_ratios`).

    The records whose config hash is in ``alike`` (the cell's own settings at other seeds and
    systems, :func:`flows.ledger.plan.same_settings`) come first, in that order, and the
    method's other records only for a cell they leave without an estimate: one method trains
    several times slower under one protocol than under another (an adjoint's backward solves),
    and the ledger keeps both."""
    from tasks.machine import busy_seconds

    kind = "cuda" if device.startswith("cuda") else "cpu"
    ratio = speed_ratios(records, hardware, kind)  # (this processor's own records: not in it)
    mine = [r for r in _timed(records, kind) if r.method == method and r.ablation == ablation]
    timed = [(r, r.timed_seconds) for r in mine if r.timed_seconds is not None]

    def estimates(pool: Sequence[tuple[LedgerRecord, float]]) -> dict[str, float | None]:
        usable = [(r.system, t * ratio.get(r.hardware or "", 1.0)) for r, t in pool]
        here = [(r.system, t) for r, t in pool if r.hardware == hardware]
        return {s: _cell_seconds(s, here, usable) for pack in packs for s in pack}

    first = estimates([(r, t) for r, t in timed if r.config_hash in alike])
    rest = estimates(timed) if None in first.values() else first
    estimated = {s: t if t is not None else rest[s] for s, t in first.items()}
    cells = {s: t for s, t in estimated.items() if t is not None}
    if not packs or len(cells) < len(estimated):
        return None
    slowest = [max(cells[s] for s in pack) for pack in packs]
    return FIXED_SECONDS + max(busy_seconds((("cpu", s) for s in slowest), workers))


def _timed(records: Sequence[LedgerRecord], kind: str) -> list[LedgerRecord]:
    """The records with a training time (:attr:`~tasks.ledger.LedgerRecord.timed_seconds`)
    made on ``kind`` of device (``cpu``, ``cuda``)."""
    return [
        r for r in records if r.timed_seconds is not None and (r.device or "cpu").startswith(kind)
    ]


def speed_ratios(
    records: Sequence[LedgerRecord], hardware: str | None, kind: str = "cpu"
) -> dict[str, float]:
    """For each other processor named in ``records`` made on ``kind`` of device (``cpu``,
    ``cuda``), how long ``hardware`` takes of what it takes: the median, over the cells both
    recorded (method, ablation, system; any seed), of the ratio of their median training
    times. Processors with no cell in common are left out (their records count as they are)."""
    times: dict[str | None, dict[tuple[str, str, str], list[float]]] = {}
    for r in _timed(records, kind):
        key = (r.method, r.ablation, r.system)
        times.setdefault(r.hardware, {}).setdefault(key, []).append(r.timed_seconds)  # type: ignore[arg-type]
    ours = times.get(hardware, {}) if hardware is not None else {}
    out: dict[str, float] = {}
    for other, theirs in times.items():
        common = ours.keys() & theirs.keys()
        if other is not None and other != hardware and common:
            out[other] = statistics.median(
                statistics.median(ours[k]) / statistics.median(theirs[k]) for k in common
            )
    return out


def _cell_seconds(
    system: str, here: Sequence[tuple[str, float]], anywhere: Sequence[tuple[str, float]]
) -> float | None:
    """The median of the newest :data:`RECENT_RECORDS` times of ``system`` in the first pool
    that has some, else of the pool's newest whatever their system (pools in ledger order)."""
    for pool in (here, anywhere):
        same = [t for s, t in pool if s == system]
        if same or pool:
            return statistics.median((same or [t for _, t in pool])[-RECENT_RECORDS:])
    return None
