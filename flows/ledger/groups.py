"""The unit ``nllab ledger run`` trains: the cells one benchmark trains, every system × seed of
one method (and ablation, or a study's variant). The type every module of :mod:`flows.ledger`
shares, so that none of them imports another for it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tasks.ledger.records import row_label

if TYPE_CHECKING:
    from tasks.ledger import LedgerCell

__all__ = ["LedgerGroup"]


@dataclass(frozen=True)
class LedgerGroup:
    """Cells trained by one benchmark: every system × seed of one method (and ablation; in a
    study, its variant: :attr:`tasks.ledger.LedgerCell.ablation`)."""

    method: str
    ablation: str
    seeds: tuple[int, ...]
    systems: tuple[str, ...]
    #: "" for Table 3, its ablation and the peers, else the study the cells are of
    study: str = ""

    @property
    def row(self) -> str:
        """The method with its study and ablation (or variant) in brackets."""
        return row_label(self.method, self.ablation, self.study)

    @property
    def label(self) -> str:
        what = self.row
        seeds = ",".join(map(str, self.seeds))
        return (
            f"{what} seed{'s' if len(self.seeds) > 1 else ''} {seeds} on {', '.join(self.systems)}"
        )

    @property
    def size(self) -> int:
        """Its cells: systems × seeds."""
        return len(self.systems) * len(self.seeds)

    def holds(self, cell: LedgerCell) -> bool:
        """Whether ``cell`` is one of this group's."""
        return (
            cell.method == self.method
            and cell.study == self.study
            and cell.ablation == self.ablation
            and cell.seed in self.seeds
            and cell.system in self.systems
        )

    def largest_part(self, cells: set[tuple[str, int]]) -> LedgerGroup | None:
        """The largest ``systems × seeds`` of this group (its first seeds) whose cells are all
        in ``cells`` ((system, seed) pairs): a benchmark's cells are such a product."""
        best: LedgerGroup | None = None
        for k in range(len(self.seeds), 0, -1):
            seeds = self.seeds[:k]
            systems = tuple(s for s in self.systems if all((s, seed) in cells for seed in seeds))
            if systems and (best is None or len(systems) * k > best.size):
                best = replace(self, systems=systems, seeds=seeds)
        return best
