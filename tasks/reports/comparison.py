"""Two benchmarks' cells side by side: per cell a verdict, by one rule (plain functions over the
cells' records, no store access; :mod:`flows.reports.compare` finds the benchmarks and prints).

A cell is a record of a benchmark's ``cells.json`` (``system``, ``method``, ``seed``, ``status``,
``test_rmse``, ``run_id``). Its test RMSE before and after is judged so:

* ``unchanged``: equal up to floating-point rounding, a relative difference of at most
  :data:`ROUNDING` (a retrained run whose reductions summed in another order differs by a few
  units in the last place: ``+8e-17`` is no change);
* ``within tolerance``: changed by no more than the larger of the seeds' spread (the population
  standard deviation of its system and method's test RMSE over seeds in the earlier benchmark;
  none with one seed) and the relative tolerance ``rtol`` of the earlier value (default
  :data:`RTOL`);
* ``regressed`` / ``improved``: worse / better beyond both (a cell that failed now and finished
  before has regressed; the other way round it improved);
* ``new`` / ``gone``: in one benchmark only.

The seed spread is the yardstick of a benchmark's own noise (Bouthillier et al., "Accounting
for variance in machine learning benchmarks", MLSys 2021); the relative floor keeps a
one-seed benchmark, which has no spread, from flagging every retrained cell.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, SupportsFloat

import numpy as np

from tasks.tracking.tags import Metrics

__all__ = [
    "ROUNDING",
    "RTOL",
    "VERDICTS",
    "CellChange",
    "Comparison",
    "Verdict",
    "cell_key",
    "cell_rmse",
    "compare_cells",
    "fingerprint_change",
    "judge",
    "seed_spreads",
]

Verdict = Literal["unchanged", "within tolerance", "regressed", "improved", "new", "gone"]
#: Every verdict, the ones a reader acts on first.
VERDICTS: tuple[Verdict, ...] = (
    "regressed",
    "improved",
    "within tolerance",
    "new",
    "gone",
    "unchanged",
)
#: Relative difference up to which two test RMSEs are the same number (float64 rounding, with
#: room for the summation order of a retrained run, far below any change training makes).
ROUNDING = 1e-9
#: The default relative tolerance of a change (of the earlier test RMSE).
RTOL = 0.05

#: ``(model, system)`` numerics fingerprints of a cell's run, ``None`` where not recorded.
Prints = Mapping[str, tuple[str, str] | None]


@dataclass(frozen=True)
class CellChange:
    """One cell in either or both benchmarks."""

    key: str
    system: str
    method: str
    before: float | None
    after: float | None
    spread: float
    changed: str  # "model", "data set", "model, data set", "" (none) or "not recorded"
    verdict: Verdict

    @property
    def delta(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before


@dataclass(frozen=True)
class Comparison:
    """The cells of benchmark ``after_run`` beside those of ``before_run`` (start times in ms
    since the epoch, as the store records them), judged with relative tolerance ``rtol``."""

    after_run: str
    before_run: str
    profile: str
    cells: tuple[CellChange, ...]
    rtol: float = RTOL
    after_start: int = 0
    before_start: int = 0

    def count(self, verdict: Verdict) -> int:
        return sum(c.verdict == verdict for c in self.cells)

    @property
    def regressions(self) -> int:
        return self.count("regressed")

    def ordered(self) -> list[CellChange]:
        """The cells, changed ones first (in :data:`VERDICTS` order), then by key."""
        return sorted(self.cells, key=lambda c: (VERDICTS.index(c.verdict), c.key))


def cell_key(cell: Mapping[str, object]) -> str:
    return f"{cell['system']}/{cell['method']}/seed{cell['seed']}"


def cell_rmse(cell: Mapping[str, object] | None) -> float | None:
    """The test RMSE of a cell that has a result (finished or reused), else ``None``."""
    if cell is None or cell.get("status") not in ("finished", "reused"):
        return None
    v = cell.get(Metrics.TEST_RMSE)
    if not isinstance(v, str | SupportsFloat):  # none recorded
        return None
    return float(v) if math.isfinite(float(v)) else None


def seed_spreads(cells: Sequence[Mapping[str, object]]) -> dict[tuple[str, str], float]:
    """Per (system, method), the population standard deviation of test RMSE over its seeds."""
    groups: dict[tuple[str, str], list[float]] = {}
    for c in cells:
        if (v := cell_rmse(c)) is not None:
            groups.setdefault((str(c["system"]), str(c["method"])), []).append(v)
    return {k: float(np.std(v)) for k, v in groups.items()}


def fingerprint_change(before: tuple[str, str] | None, after: tuple[str, str] | None) -> str:
    """Which numerics fingerprint differs between two runs: ``model``, ``data set``, both,
    ``""`` (neither) or ``not recorded``."""
    if before is None or after is None:
        return "not recorded"
    names = [n for n, b, a in zip(("model", "data set"), before, after, strict=True) if b != a]
    return ", ".join(names)


def judge(before: float | None, after: float | None, spread: float, rtol: float = RTOL) -> Verdict:
    """The verdict of one cell's test RMSE ``before`` and ``after`` (lower is better; ``None``:
    no result), by the rule of this module."""
    if before is None and after is None:
        return "unchanged"
    if after is None:
        return "regressed"  # failed now
    if before is None:
        return "improved"  # failed before
    change = abs(after - before)
    if change <= ROUNDING * max(abs(before), abs(after)):
        return "unchanged"
    if change <= max(spread, rtol * abs(before)):
        return "within tolerance"
    return "regressed" if after > before else "improved"


def _change(
    key: str,
    b: Mapping[str, object] | None,
    a: Mapping[str, object] | None,
    spreads: Mapping[tuple[str, str], float],
    prints: Prints,
    rtol: float,
) -> CellChange:
    """One cell before (``b``) and after (``a``; either may be missing) as a verdict."""
    c = a or b
    assert c is not None
    system, method = str(c["system"]), str(c["method"])
    spread = spreads.get((system, method), 0.0)
    if b is None or a is None:
        verdict: Verdict = "new" if b is None else "gone"
        changed = ""
    else:
        same_run = a.get("run_id") == b.get("run_id")
        runs = prints.get(str(b.get("run_id"))), prints.get(str(a.get("run_id")))
        changed = "" if same_run else fingerprint_change(*runs)
        verdict = judge(cell_rmse(b), cell_rmse(a), spread, rtol)
    return CellChange(key, system, method, cell_rmse(b), cell_rmse(a), spread, changed, verdict)


def compare_cells(
    after: Sequence[Mapping[str, object]],
    before: Sequence[Mapping[str, object]],
    prints: Prints,
    rtol: float = RTOL,
) -> tuple[CellChange, ...]:
    """Each cell of either benchmark, judged (the later benchmark's order, then cells gone);
    ``prints``: the numerics fingerprints of the cells' runs, by run id."""
    spreads = seed_spreads(before)
    old = {cell_key(c): c for c in before}
    new = {cell_key(c): c for c in after}
    return tuple(
        _change(key, old.get(key), new.get(key), spreads, prints, rtol)
        for key in [*new, *(k for k in old if k not in new)]
    )
