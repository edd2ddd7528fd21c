"""Is this cell done? The one answer (:func:`stored_results`): a finished run in the store whose
model loads and, by default, whose numerics fingerprints equal today's.

Every finished run of a cell's config hash is a candidate, newest first, not only the newest:
switching the CPU numerics mode (or any change that alters a fingerprint) back and forth on one
home reuses the runs each mode trained instead of training the cell again (the same lookup as a
content-addressed cache keyed by inputs and toolchain, e.g. Bazel's action cache).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from tasks._notify import notify_once
from tasks.config import CellConfig, Reuse
from tasks.machine import numerics
from tasks.results import CellResult

if TYPE_CHECKING:
    from tasks.tracking import Queries, RunRecord

__all__ = ["stored_result", "stored_results"]


def _candidates(
    cell: CellConfig, runs: Sequence[RunRecord], reuse: Reuse, today: numerics.CellNumerics
) -> list[RunRecord]:
    """The finished runs of ``cell`` (newest first) that ``reuse`` accepts."""
    if reuse == "numerics":
        return [r for r in runs if numerics.agrees(cell, r.tags, today)]
    return list(runs)


def stored_results(
    queries: Queries,
    cells: Iterable[CellConfig],
    reuse: Reuse = "numerics",
    *,
    tell: bool = True,
    device: str = "cpu",
) -> tuple[list[CellResult], list[CellConfig]]:
    """Is this cell done? ``cells`` split into those with a finished run in the store (as
    ``reused`` results) and those to run, in input order.

    The newest finished run of the config hash that ``reuse`` accepts and whose model artifact
    is present and loads (:meth:`tasks.tracking.Queries.first_usable`) is reused; a cell whose
    accepted runs all have unusable models is run again and the user told why, once per run.
    ``reuse="numerics"``: a run is accepted only if its numerics fingerprints equal today's
    (:mod:`tasks.machine.numerics`; a run stored before fingerprints were recorded has none) and it
    computed on a device the cells may train on (``device``: ``cpu``, ``cuda`` or ``auto``;
    :func:`tasks.machine.numerics.accepted_devices`: a GPU's run is never a CPU cell's), and a
    cell with finished runs none of which is accepted is told in one line per changed model or
    system (``tell``); ``config``: any finished run of the config hash; ``never``: none.
    """
    cells = list(cells)
    # also cached for the worker processes that tag the runs
    today = numerics.warm(cells, device)
    if reuse == "never":
        return [], cells
    runs = queries.finished_cell_runs(c.config_hash() for c in cells)
    done: dict[str, RunRecord] = {}
    stale: dict[str, RunRecord] = {}
    for c in cells:
        h = c.config_hash()
        if h in done or h in stale or not runs.get(h):
            continue
        usable, unusable = queries.first_usable(_candidates(c, runs[h], reuse, today))
        if usable is not None:
            done[h] = usable
        elif unusable is not None:
            record, problem = unusable
            notify_once(
                f"unusable:{record.run_id}",
                f"cell {c.key}: not reusing its finished run {record.run_id}: {problem}; "
                "training it again",
            )
        else:  # finished runs, none of today's numerics: the newest says what changed
            stale[h] = runs[h][0]
    if tell and stale:
        for line in numerics.stale(cells, stale, today)[1]:
            notify_once(f"numerics:{line}", line)
    reused = [CellResult.reused(c, done[c.config_hash()]) for c in cells if c.config_hash() in done]
    return reused, [c for c in cells if c.config_hash() not in done]


def stored_result(
    queries: Queries, cell: CellConfig, reuse: Reuse = "numerics"
) -> CellResult | None:
    """:func:`stored_results` of one cell: its ``reused`` result, or ``None``."""
    reused, _ = stored_results(queries, [cell], reuse, tell=False)
    return reused[0] if reused else None
