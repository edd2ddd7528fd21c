"""What the ledger's records say about its cells: one rule that ``nllab ledger status``, ``ledger
table`` and ``ledger run`` share (the command line formats and prints; this module keeps data).

**The counting rule.** A cell counts as *recorded* when the ledger holds a record under its
config hash today (:class:`tasks.ledger.scope.LedgerCell`) that names the numerics that made it:
the record at today's numerics fingerprints if there is one, else the latest line. A counted
record made by other numerics than today's is flagged ``older`` (listed by ``status``, retrained
by ``ledger run --refresh-older``). A record that predates fingerprints (no commit, hardware or
numerics can be checked: it could not be retrained to the same bits) counts for nothing: its
cell is ``predates``, listed, and trained again by ``ledger run``; records only under another
config hash count for nothing either (``other_config``, listed). Every view's mean ± std (the
sample std, ddof 1) and verdict (:func:`tasks.reports.verdict.verdict`) are over the counted
records.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from tasks.ledger.provenance import computed_on_gpu
from tasks.ledger.records import LedgerRecord
from tasks.ledger.scope import LedgerCell
from tasks.reports import (
    PAPER_STEREOGRAPHIC,
    Published,
    ResultsTable,
    Table,
    TableCell,
    number,
    results_table,
)
from tasks.reports.verdict import ALPHA, VERDICT_RULE, Verdict, t_test_p_value, verdict

__all__ = [
    "PACE_EPOCHS",
    "BestOfSystem",
    "CellProgress",
    "CellState",
    "LedgerStatus",
    "StatusGroup",
    "ablation_table",
    "best_per_system",
    "cell_progress",
    "cell_states",
    "ledger_status",
    "ledger_table",
    "table3_states",
]

State = Literal["recorded", "missing", "predates", "other_config"]
Numerics = Literal["today", "older", "gpu", "predates", ""]


@dataclass(frozen=True)
class CellState:
    """Where one cell stands in the ledger, with the record that counts for it (or, under
    ``predates``, its latest record without fingerprints; under ``other_config``, the latest
    record under another config hash)."""

    cell: LedgerCell
    state: State
    record: LedgerRecord | None = None

    @property
    def numerics(self) -> Numerics:
        """Of a cell's record under today's config: made by today's numerics, by ``older``
        (other CPU) ones, on a ``gpu`` (its own numerics: counted, and said), or ``predates``
        fingerprints (uncounted); "" when there is none."""
        if self.state == "predates":
            return "predates"
        if self.state != "recorded" or self.record is None:
            return ""
        if computed_on_gpu(self.record.numerics):
            return "gpu"
        today = self.cell.numerics
        return "today" if today is None or self.record.numerics == today else "older"


def cell_states(records: Iterable[LedgerRecord], cells: Sequence[LedgerCell]) -> list[CellState]:
    """Each of ``cells`` under the counting rule (module docstring). A study's cell (another
    table of the paper) counts any record of its config hash, whichever table asked for it (a
    study cell that is a Table 3 cell reuses that record), that has what the study measures."""
    records = list(records)
    by_cell: dict[tuple[str, str, str, str, int], list[LedgerRecord]] = {}
    by_hash: dict[str, list[LedgerRecord]] = {}
    for r in records:
        by_cell.setdefault((r.system, r.method, r.study, r.ablation, r.seed), []).append(r)
        by_hash.setdefault(r.config_hash, []).append(r)
    states = []
    for c in cells:
        mine = by_cell.get(c.key, [])
        if c.study:
            current = [r for r in by_hash.get(c.config_hash, []) if _has(r, c.measure)]
        else:
            current = [r for r in mine if r.config_hash == c.config_hash]
        counted = [r for r in current if r.numerics is not None]
        if counted:
            today = [r for r in counted if c.numerics is not None and r.numerics == c.numerics]
            states.append(CellState(c, "recorded", (today or counted)[-1]))
        elif current:
            states.append(CellState(c, "predates", current[-1]))
        elif mine:
            states.append(CellState(c, "other_config", mine[-1]))
        else:
            states.append(CellState(c, "missing"))
    return states


def _has(record: LedgerRecord, measure: str) -> bool:
    return not measure or record.measured.has(measure)


@dataclass(frozen=True)
class StatusGroup:
    """One (method, ablation, system) of the selection: seeds recorded of those selected, how
    many of those by older numerics, and the verdict of their mean against the paper."""

    method: str
    ablation: str
    system: str
    recorded: int
    selected: int
    older: int
    verdict: Verdict
    missing_seeds: tuple[int, ...]


@dataclass(frozen=True)
class LedgerStatus:
    """The selected cells' states and the number of lines the ledger holds; ``tables``: the
    studies selected, in the ledger's order, those without a cell to train too (a table that is
    timed rather than trained: the wall clock's)."""

    records: int
    states: tuple[CellState, ...]
    tables: tuple[str, ...] = ()

    def flagged(self, numerics: Numerics) -> list[CellState]:
        """The recorded cells whose record has ``numerics`` (``older``, ``predates``)."""
        return [s for s in self.states if s.numerics == numerics]

    def counted(self, ablation: bool | None = None, *, peers: bool = False) -> list[LedgerRecord]:
        """The records that count (one per recorded cell); ``ablation`` False: Table 3's, True:
        the ablations', None: every selected cell's (the studies' too); ``peers``: the
        Laplace-domain peers' only (:data:`tasks.ledger.scope.PEERS`)."""
        return [
            s.record
            for s in self.states
            if s.state == "recorded"
            and s.record is not None
            and (
                s.cell.peer
                if peers
                else ablation is None or (s.cell.ablated if ablation else s.cell.table3)
            )
        ]

    def study_states(self, study: str) -> list[CellState]:
        """The selected cells of one study (another table of the paper), in its order."""
        return [s for s in self.states if s.cell.study == study]

    @property
    def studies(self) -> tuple[str, ...]:
        """The studies selected (:attr:`tables`), then any other with selected cells, in the
        scope's order."""
        cells = (s.cell.study for s in self.states if s.cell.study)
        return tuple(dict.fromkeys((*self.tables, *cells)))

    def groups(self) -> list[StatusGroup]:
        """Per (method, ablation, system), in the selection's order; verdicts as the tables
        draw them (:func:`ledger_table`, :func:`ablation_table`)."""
        verdicts = _verdicts(self)
        order: dict[tuple[str, str, str], list[CellState]] = {}
        for s in self.states:
            if not s.cell.study:  # (a study's cells have their own line: its table's)
                order.setdefault((s.cell.method, s.cell.ablation, s.cell.system), []).append(s)
        return [
            StatusGroup(
                m,
                a,
                sy,
                sum(s.state == "recorded" for s in group),
                len(group),
                sum(s.numerics == "older" for s in group),
                verdicts.get((m, a, sy), ""),
                tuple(s.cell.seed for s in group if s.state != "recorded"),
            )
            for (m, a, sy), group in order.items()
        ]


def ledger_status(
    records: Sequence[LedgerRecord], cells: Sequence[LedgerCell], tables: Sequence[str] = ()
) -> LedgerStatus:
    """The status of ``cells`` (a selection of the ledger's scope) given its ``records``;
    ``tables``: the studies selected (:attr:`LedgerStatus.tables`)."""
    return LedgerStatus(len(records), tuple(cell_states(records, cells)), tuple(tables))


def table3_states(status: LedgerStatus) -> list[CellState]:
    """The selected cells of Table 3: neither an ablation's, a study's nor a Laplace-domain
    peer's."""
    return [s for s in status.states if s.cell.table3]


def ledger_table(status: LedgerStatus) -> tuple[ResultsTable, Table]:
    """The paper's Table 3 from the counted records: the results table (mean ± std, verdict,
    dominated cells flagged: :func:`tasks.reports.reporting.results_table`) and its layout with the
    seed count per cell and how many of them older numerics made. Every (method, system) of
    the selection has its place, "–" where nothing is recorded yet."""
    table3 = table3_states(status)
    expected = dict.fromkeys((s.cell.method, s.cell.system) for s in table3)
    results = results_table(status.counted(ablation=False), profile="paper", expected=expected)
    notes: dict[tuple[str, str], str] = {}
    for flag, said in (("older", "older"), ("gpu", "on GPU")):
        flagged = Counter((s.cell.method, s.cell.system) for s in table3 if s.numerics == flag)
        for pair, n in flagged.items():
            notes[pair] = f"{notes[pair]}; {n} {said}" if pair in notes else f"{n} {said}"
    return results, results.main_table(seeds=True, notes=notes)


def _summary(records: Sequence[LedgerRecord]) -> tuple[float, float | None, int]:
    values = [r.test_rmse for r in records]
    if not values:
        return math.nan, None, 0
    std = statistics.stdev(values) if len(values) > 1 else None
    return statistics.fmean(values), std, len(values)


def _ablation_cell(records: Sequence[LedgerRecord], paper: Published | None) -> TableCell:
    mean, std, n = _summary(records)
    figure = f"{number(paper.mean)} ± {number(paper.std)}" if paper is not None else "—"
    if not n:
        return TableCell("–", paper=figure)
    text = number(mean) if n == 1 else f"{number(mean)} ± {number(std)}"
    judged = verdict(mean, std, n, paper.mean, paper.std) if paper is not None else ""
    return TableCell(f"{text} (n={n})", paper=figure, verdict=judged)


def _ablation_cells(status: LedgerStatus) -> dict[str, tuple[TableCell, TableCell]]:
    """Per system of the selected ablation cells: (map off, map on) as table cells."""
    counted = [s for s in status.states if s.state == "recorded" and s.record is not None]
    out = {}
    for system in dict.fromkeys(s.cell.system for s in status.states if s.cell.ablated):
        mine = [s for s in counted if s.cell.system == system]
        off = [s.record for s in mine if s.cell.ablated and s.record is not None]
        on = [
            s.record
            for s in mine
            if s.cell.table3 and s.cell.method == "neural_laplace" and s.record is not None
        ]
        paper_off, paper_on = PAPER_STEREOGRAPHIC.get(system, (None, None))
        out[system] = (_ablation_cell(off, paper_off), _ablation_cell(on, paper_on))
    return out


def ablation_table(status: LedgerStatus) -> Table:
    """The paper's Table 5 (top block) beside Table 3: Neural Laplace without the
    stereographic map (the ledger's ablation cells) and with it (Table 3's own Neural Laplace
    records of the selection), per system, each beside the paper's single figure for that
    column (the verdict: a one-sample t-test, :func:`tasks.reports.verdict.verdict`)."""
    rows = tuple(
        (TableCell(system), off, on) for system, (off, on) in _ablation_cells(status).items()
    )
    caption = (
        "Table 5 (Neural Laplace, stereographic map off/on): test RMSE, mean ± std (sample "
        "std, ddof 1) over seeds; 'on' is Table 3's Neural Laplace column; the paper's mean ± "
        f"std (5 runs) in brackets (— where the paper has none); {VERDICT_RULE}."
    )
    return Table(("system", "map off (ablation)", "map on (Table 3)"), rows, caption)


def _verdicts(status: LedgerStatus) -> dict[tuple[str, str, str], Verdict]:
    """(method, ablation, system) → the verdict its table cell shows."""
    table3, _ = ledger_table(status)
    out: dict[tuple[str, str, str], Verdict] = {
        (m, "", s): v for (m, s), v in table3.verdicts().items()
    }
    off = {system: cells[0] for system, cells in _ablation_cells(status).items()}
    for s in status.states:
        if s.cell.ablated:
            out[(s.cell.method, s.cell.ablation, s.cell.system)] = off[s.cell.system].verdict
    return out


# -- the best method per system ----------------------------------------------------------------
@dataclass(frozen=True)
class BestOfSystem:
    """The two methods of lowest mean test RMSE on one system (Table 3's counted records), and
    the paired t-test between them over the seeds both recorded (a seed's cells share their data
    set: the same system, seed and data config). ``complete``: every selected method of the
    system has all its selected seeds recorded."""

    system: str
    best: str
    best_mean: float
    best_n: int
    runner_up: str | None
    runner_up_mean: float | None
    paired_seeds: int
    p_value: float | None
    complete: bool
    #: the seeds every selected method of the system has recorded (empty where one has none)
    #: and the method of lowest mean test RMSE over them: a like-for-like ranking (the same data
    #: sets for every method) before every seed is in
    shared_seeds: tuple[int, ...] = ()
    shared_best: str | None = None

    @property
    def significant(self) -> bool:
        """Whether the test finds the best ahead of the runner-up at the 5 % level."""
        return self.p_value is not None and self.p_value < ALPHA


def best_per_system(status: LedgerStatus) -> list[BestOfSystem]:
    """Per system of the selection's Table 3 (in its order), the best method and the runner-up
    by mean test RMSE over the counted records, with their paired t-test (two-sided,
    ``k − 1`` degrees of freedom over the ``k`` shared seeds; None under two seeds or without
    a spread of differences). Systems with no counted record are left out."""
    table3 = table3_states(status)
    out = []
    for system in dict.fromkeys(s.cell.system for s in table3):
        mine = [s for s in table3 if s.cell.system == system]
        by_method: dict[str, dict[int, float]] = {}
        for s in mine:
            if s.state == "recorded" and s.record is not None:
                by_method.setdefault(s.cell.method, {})[s.cell.seed] = s.record.test_rmse
        if not by_method:
            continue
        ranked = sorted(by_method, key=lambda m: statistics.fmean(by_method[m].values()))
        best, second = ranked[0], (ranked[1] if len(ranked) > 1 else None)
        shared = sorted(set(by_method[best]) & set(by_method[second])) if second else []
        every = [set(by_method.get(m, ())) for m in dict.fromkeys(s.cell.method for s in mine)]
        common = tuple(sorted(set.intersection(*every)))
        out.append(
            BestOfSystem(
                system,
                best,
                statistics.fmean(by_method[best].values()),
                len(by_method[best]),
                second,
                statistics.fmean(by_method[second].values()) if second else None,
                len(shared),
                _paired_p([by_method[best][k] - by_method[second][k] for k in shared])
                if second
                else None,
                all(s.state == "recorded" for s in mine),
                common,
                min(by_method, key=lambda m: statistics.fmean(by_method[m][k] for k in common))
                if common
                else None,
            )
        )
    return out


def _paired_p(differences: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test of ``differences`` against 0."""
    k = len(differences)
    if k < 2:
        return None
    sd = statistics.stdev(differences)
    if sd == 0:
        return None
    return t_test_p_value(abs(statistics.fmean(differences)) / (sd / math.sqrt(k)), k - 1)


# -- cells training now -------------------------------------------------------------------------
#: The recent epochs a cell's pace is measured over (the load of the machine changes).
PACE_EPOCHS = 20


@dataclass(frozen=True)
class CellProgress:
    """A ledger cell that a tracking store's run is training now: ``epochs_done`` of
    ``epochs`` (``None`` where the run does not say), ``seconds_per_epoch`` the wall time
    between its last :data:`PACE_EPOCHS` epochs' metrics (``None`` before two epochs), and
    whether it may stop early (a patience or a time limit)."""

    cell: LedgerCell
    run_id: str
    epochs_done: int
    epochs: int | None
    seconds_per_epoch: float | None
    may_stop_early: bool = False

    @property
    def seconds_left(self) -> float | None:
        """Wall seconds to its last epoch at the recent pace (evaluation not included)."""
        if self.epochs is None or self.seconds_per_epoch is None:
            return None
        return max(self.epochs - self.epochs_done, 0) * self.seconds_per_epoch


def _int_param(params: dict[str, str], key: str) -> int | None:
    try:
        return int(params[key])
    except (KeyError, ValueError):
        return None


def cell_progress(
    cell: LedgerCell,
    run_id: str,
    params: dict[str, str],
    epoch_times: Sequence[tuple[int, float]],
    resumed_at: int | None = None,
) -> CellProgress:
    """Where the run ``run_id`` of ``cell`` stands, from its logged parameters (the training
    config: ``training.epochs``, ``training.patience``, ``training.max_train_seconds``) and
    ``epoch_times``: (epoch, seconds) of each epoch's metric as the store stamped it (epochs
    count from 0). ``resumed_at``: the first epoch the run trained after resuming from a
    checkpoint (the earlier ones were logged at once: the pace is measured from the last of
    them on)."""
    times = sorted(epoch_times)
    paced = [t for t in times if resumed_at is None or t[0] >= resumed_at - 1]
    pace = None
    if len(paced) >= 2:
        (first_epoch, first), (last_epoch, last) = paced[-(PACE_EPOCHS + 1) :][0], paced[-1]
        if last_epoch > first_epoch:
            pace = (last - first) / (last_epoch - first_epoch)
    early = any(
        params.get(key, "None") not in ("None", "null", "")
        for key in ("training.patience", "training.max_train_seconds")
    )
    done = times[-1][0] + 1 if times else 0
    return CellProgress(cell, run_id, done, _int_param(params, "training.epochs"), pace, early)
