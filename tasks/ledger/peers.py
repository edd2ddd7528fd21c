"""The Laplace-domain peers in the ledger (:data:`tasks.ledger.scope.PEERS`: Laplace-Net, the
Laplace Neural Operator, the neural DDE) beside Neural Laplace, per system: the data of ``nllab
ledger table``'s peers section and of the page ``docs/results/laplace_peers.md``.

They are not cells of the paper's Table 3 (Holt et al., 2022), so no figure of the paper judges
them: each cell shows the mean ± sample std (ddof 1) over the counted records (the counting rule
of :mod:`tasks.ledger.views`) and the seed count, with Neural Laplace's Table 3 column and the
best Table 3 baseline of the system for context, and which of these is lowest.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tasks.config.names import PAPER_METHODS, model_label
from tasks.ledger.scope import PEERS
from tasks.ledger.views import LedgerStatus, table3_states
from tasks.reports import Table, TableCell, number, plural

__all__ = ["NOT_RECORDED", "PeerRow", "Summary", "peer_rows", "peers_count", "peers_table"]

#: What a cell with no counted record shows.
NOT_RECORDED = "not recorded yet"
#: The context column: the method the peers are measured against.
CONTEXT = "neural_laplace"


@dataclass(frozen=True)
class Summary:
    """One method's counted records on one system."""

    method: str
    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """The sample std (ddof 1); None under two seeds."""
        return statistics.stdev(self.values) if self.n > 1 else None

    def text(self, *, named: bool = False) -> str:
        """``0.1234 ± 0.0056 (n=5)``, one seed without a spread; ``named``: the method's label
        in the brackets too."""
        spread = "" if self.std is None else f" ± {number(self.std)}"
        name = f", {model_label(self.method)}" if named else ""
        return f"{number(self.mean)}{spread} (n={self.n}{name})"


@dataclass(frozen=True)
class PeerRow:
    """One system: Neural Laplace's summary, each peer's, the best Table 3 baseline's (lowest
    mean) and the lowest of them all (None where nothing is recorded); ``complete``: every
    selected cell of the system is recorded."""

    system: str
    context: Summary | None
    peers: dict[str, Summary | None]
    baseline: Summary | None
    complete: bool

    @property
    def best(self) -> Summary | None:
        shown = [self.context, *self.peers.values(), self.baseline]
        return min((s for s in shown if s is not None), key=lambda s: s.mean, default=None)


def _summaries(states: Sequence) -> dict[tuple[str, str], Summary]:
    values: dict[tuple[str, str], list[float]] = {}
    for s in states:
        if s.state == "recorded" and s.record is not None:
            values.setdefault((s.cell.method, s.cell.system), []).append(s.record.test_rmse)
    return {(m, sy): Summary(m, tuple(v)) for (m, sy), v in values.items()}


def peer_rows(status: LedgerStatus, peers: Sequence[str] = PEERS) -> list[PeerRow]:
    """Per system of the selection (in its order), the peers' summaries beside Neural
    Laplace's and the best baseline's (Table 3's cells of the selection)."""
    table3 = table3_states(status)
    mine = [s for s in status.states if s.cell.peer]
    summaries = _summaries([*table3, *mine])
    baselines = [m for m in PAPER_METHODS if m != CONTEXT]
    rows = []
    shown = [s for s in status.states if s.cell.table3 or s.cell.peer]
    for system in dict.fromkeys(s.cell.system for s in shown):
        recorded = [summaries[(m, system)] for m in baselines if (m, system) in summaries]
        ours = [s for s in (*table3, *mine) if s.cell.system == system]
        rows.append(
            PeerRow(
                system,
                summaries.get((CONTEXT, system)),
                {p: summaries.get((p, system)) for p in peers},
                min(recorded, key=lambda s: s.mean, default=None),
                all(s.state == "recorded" for s in ours),
            )
        )
    return rows


def peers_table(status: LedgerStatus, peers: Sequence[str] = PEERS) -> Table:
    """The systems × (Neural Laplace, the peers, the best baseline, the lowest of them) table
    of the selection's counted records."""
    label = model_label
    header = (
        "system",
        f"{label(CONTEXT)} (Table 3)",
        *(label(p) for p in peers),
        "best baseline (Table 3)",
        "lowest mean",
    )

    def cell(s: Summary | None, *, named: bool = False) -> TableCell:
        return TableCell(NOT_RECORDED if s is None else s.text(named=named))

    rows = []
    for r in peer_rows(status, peers):
        best = r.best
        lowest = "–" if best is None else label(best.method) + ("" if r.complete else " (so far)")
        rows.append(
            (
                TableCell(r.system),
                cell(r.context),
                *(cell(r.peers[p]) for p in peers),
                cell(r.baseline, named=True),
                TableCell(lowest),
            )
        )
    caption = (
        "Test RMSE at the paper's budget, mean ± sample std (ddof 1) over the recorded seeds "
        "(n); no figure of the paper to judge these models against. 'not recorded yet': no "
        "record of the cell counts (a record made before numerics fingerprints counts for "
        "nothing); 'so far': not every cell of the system is recorded yet."
    )
    return Table(header, tuple(rows), caption)


def peers_count(status: LedgerStatus) -> str:
    """``Laplace-domain peers: 18 of 90 cells recorded.`` (the selection's peer cells)."""
    cells = [s for s in status.states if s.cell.peer]
    recorded = sum(s.state == "recorded" for s in cells)
    return f"Laplace-domain peers: {recorded} of {plural(len(cells), 'cell')} recorded."
