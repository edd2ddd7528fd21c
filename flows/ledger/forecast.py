"""How long the ledger's missing cells will take here (``nllab ledger status --time-left``).

The groups ``nllab ledger run`` would train, in its order (:func:`flows.ledger.ledger_groups`),
each with the time its time limit expects of it on this machine's CPU
(:func:`flows.ledger.recorded_seconds`: the ledger's records of the method, this processor's
where it has some, over the engine's CPU packs of the group on its workers, at most one per
core), so that the time left comes from the records, not from a reckoning by hand. A group
whose cells have training runs kept beside the ledger (:class:`nltrain.Checkpoints`: stopped
mid-way, resumed by the next run) is expected to train only the epochs those runs have left.
A method the ledger has no CPU record of yet (a new column) is expected from the committed
projection of its column (:func:`flows.ledger.projected_cell_seconds`, training epochs only),
and says so. A cell an earlier group trains (the same config: a study's cell that is a Table 3
cell, or another study's whose run it measures) is not counted twice: ``ledger run`` records
it with that group's run, or reuses the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.ledger._budget import FIXED_SECONDS, speed_ratios
from flows.ledger.groups import LedgerGroup
from flows.ledger.plan import (
    cpu_workers,
    group_config,
    ledger_groups,
    ledger_states,
    projected_cell_seconds,
    recorded_seconds,
    to_train,
    training_work,
)
from tasks.ledger import hardware_name, paper_config, read_ledger

if TYPE_CHECKING:
    from tasks.config import CellConfig, RunConfig

__all__ = ["Forecast", "GroupForecast", "forecast"]


@dataclass(frozen=True)
class GroupForecast:
    """One group ``ledger run`` would train, and its expected seconds here (None: the ledger
    has no record of its method on the CPU; ``run`` then measures its packs when it starts)."""

    group: LedgerGroup
    seconds: float | None
    #: whether the estimate rests on records of this processor (else of other processors)
    here: bool
    #: of the group's cells' planned epochs, those its kept runs have trained (they resume)
    kept_share: float = 0.0
    #: where the estimate is the projection benchmark's, not the records': the processor that
    #: measured it (:func:`flows.ledger.projected_cell_seconds`)
    projected: str | None = None
    #: the share of its cells an earlier group trains (the same config: a study's cell that
    #: is a Table 3 cell, or another study's it measures): recorded with that group's runs
    twins: float = 0.0


@dataclass(frozen=True)
class Forecast:
    """The selected missing cells as ``ledger run`` would train them on this machine's CPU."""

    groups: tuple[GroupForecast, ...]
    hardware: str  # this processor's name
    workers: int  # cells or packs at once
    #: how long this processor takes of what each other one took, on the cells both recorded
    #: (:func:`flows.ledger.speed_ratios`): their records count so
    ratios: dict[str, float]

    @property
    def cells(self) -> int:
        return sum(g.group.size for g in self.groups)

    @property
    def known_seconds(self) -> float:
        """The groups' expected seconds, one group after another, of those with an estimate."""
        return sum(g.seconds for g in self.groups if g.seconds is not None)

    @property
    def unknown(self) -> tuple[GroupForecast, ...]:
        return tuple(g for g in self.groups if g.seconds is None)


def forecast(
    ledger: Path,
    *,
    selection: dict[str, Any],
    execution: dict[str, Any] | None = None,
    kept: Mapping[tuple[str, str], int] | None = None,
) -> Forecast:
    """The selected cells that have no record at today's config, as the groups ``ledger run``
    trains them in (its order; ``selection`` and ``execution`` as
    :func:`flows.ledger.run_ledger`'s), each with its expected seconds on this machine's CPU;
    ``kept``: the epochs trained by the runs kept beside the ledger, by cell label and config
    hash (they resume)."""
    execution = {**(execution or {}), "device": "cpu"}
    states = ledger_states(ledger, selection)
    records = read_ledger(ledger)
    hardware = hardware_name("cpu")
    ours = {(r.method, r.ablation) for r in records if r.hardware == hardware}
    out: list[GroupForecast] = []
    workers = cpu_workers(paper_config(execution, config_file=selection.get("config_file")))
    kept = kept or {}
    from tasks.engine import packability_memo

    packable = packability_memo("cpu")  # (one probe per model and settings, not per group)
    ratios = speed_ratios(records, hardware, "cpu")
    todo = to_train(states)
    earlier: set[str] = set()  # the configs an earlier group trains
    for group in ledger_groups(todo, states):
        config = group_config(group, selection, execution)
        hashes = [c.config_hash for c in todo if group.holds(c)]
        twins = sum(h in earlier for h in hashes) / len(hashes) if hashes else 0.0
        earlier.update(hashes)
        seconds = recorded_seconds(group, config, records, packable=packable)
        cells = config.cells()
        planned = sum(c.training.epochs for c in cells)
        trained = sum(min(kept.get((c.key, c.config_hash()), 0), c.training.epochs) for c in cells)
        share = trained / planned if planned else 0.0
        if seconds is not None and share:  # the fixed cost stays: a resumed run pays it too
            seconds = FIXED_SECONDS + max(seconds - FIXED_SECONDS, 0.0) * (1.0 - share)
        here = (group.method, group.ablation) in ours
        projected = None
        if seconds is None and not group.ablation:
            estimate = _projected_seconds(config, ratios, workers, packable)
            if estimate is not None:
                seconds, projected = estimate
                seconds = FIXED_SECONDS + seconds * (1.0 - share)
        if seconds is not None and twins:  # (the engine reuses their runs: no training)
            seconds = FIXED_SECONDS + max(seconds - FIXED_SECONDS, 0.0) * (1.0 - twins)
        out.append(GroupForecast(group, seconds, here, share, projected, twins))
    return Forecast(tuple(out), hardware, workers, ratios)


def _projected_seconds(
    config: RunConfig,
    ratios: Mapping[str, float],
    workers: int,
    packable: Callable[[CellConfig], bool],
) -> tuple[float, str] | None:
    """The training seconds of ``config``'s cells (one method) by the committed projection of
    its column, at this processor's speed where the ledger relates the two processors
    (``ratios``), its packs spread over ``workers`` (at most one per pack), and the processor
    that measured it; None without a projection of the method."""
    from tasks.engine import make_packs

    cells = config.cells()
    projection = projected_cell_seconds(cells[0].method)
    if projection is None:
        return None
    per_cell, processor = projection
    per_cell *= ratios.get(processor, 1.0)
    seconds = 0.0
    for cell in cells:
        # the projection is of the paper profile's cells: scaled by the training each one does
        paper = paper_config(systems=[cell.system], methods=[cell.method])
        seconds += per_cell * training_work(config, cell.system) / training_work(paper, cell.system)
    packs = make_packs(cells, config.execution.pack, packable=packable)
    return seconds / max(1, min(workers, len(packs))), processor
