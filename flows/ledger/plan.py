"""What ``nllab ledger run`` has left to train and how it is grouped: the selected cells'
states, the cells without a record at today's config, those cells as benchmark runs (one
method and ablation over systems × seeds, :class:`LedgerGroup`), each group's benchmark config,
and the seconds the ledger's own records expect it to take. Plain functions over the ledger's
records and cells: :mod:`.run` trains the groups, :mod:`.forecast` says how long they would
take."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.ledger._budget import FIXED_SECONDS, expected_seconds
from flows.ledger.groups import LedgerGroup
from tasks.config import METHODS
from tasks.ledger import (
    ABLATIONS,
    PEERS,
    CellState,
    LedgerCell,
    LedgerScope,
    cell_states,
    hardware_name,
    ledger_scope,
    paper_config,
    read_ledger,
)
from tasks.ledger.variants import variant_overrides

if TYPE_CHECKING:
    from tasks.config import CellConfig, RunConfig
    from tasks.ledger import LedgerRecord
    from tasks.reports.measurements import Measurement

__all__ = [
    "cpu_workers",
    "group_config",
    "ledger_groups",
    "ledger_states",
    "measured_twins",
    "profile_of",
    "projected_cell_seconds",
    "recorded_seconds",
    "same_settings",
    "selected_states",
    "selection_profile",
    "selection_scope",
    "to_train",
    "training_work",
]


def to_train(states: Sequence[CellState], *, refresh_older: bool = False) -> list[LedgerCell]:
    """The cells ``ledger run`` trains: those with no record at today's config; with
    ``refresh_older``, also those whose counted record older numerics made. A study's cell that
    measures nothing more and has the config hash of another cell to train is left to that one
    (its record serves both)."""
    todo = [
        s.cell for s in states if s.state != "recorded" or (refresh_older and s.numerics == "older")
    ]
    elsewhere = {c.config_hash for c in todo if not c.study}
    seen: set[str] = set()
    out = []
    for c in todo:
        if c.study and not c.measure:
            if c.config_hash in elsewhere or c.config_hash in seen:
                continue
            seen.add(c.config_hash)
        out.append(c)
    return out


#: A group's key: (study, method, ablation or variant, seed).
GroupKey = tuple[str, str, str, int]


def ledger_groups(
    todo: Sequence[LedgerCell], states: Sequence[CellState], *, merge_seeds: bool = False
) -> list[LedgerGroup]:
    """``todo`` as benchmark runs, in the order that gives every column a figure first:

    1. for each Table 3 method with a system that has no recorded seed, its lowest missing seed;
    2. the cells whose records predate numerics fingerprints (they count for nothing until
       retrained: a column the ledger had once comes back whole before new seeds), then the
       ablations (so they start only once every Table 3 column has at least one seed);
    3. each study's first seed (the paper's other tables, in the order of
       :data:`flows.studies.LEDGER_STUDIES`: every table gets its first complete seed early);
    4. the remaining Table 3 seeds, seed by seed, then the studies' remaining seeds;
    5. then the Laplace-domain peers (:data:`tasks.ledger.scope.PEERS`, not Table 3's): each
       one's lowest missing seed, then their remaining seeds, seed by seed.

    Each group is one seed of one method (and variant) on its missing systems; ``merge_seeds``
    (a GPU, where bigger packs pay) joins the seeds of one method that miss the same systems, a
    method without any seed in phase 1 with all of them."""
    by_seed: dict[GroupKey, list[str]] = {}
    for c in todo:
        by_seed.setdefault((c.study, c.method, c.ablation, c.seed), []).append(c.system)
    order = _GroupOrder(todo, states, by_seed, merge_seeds)
    groups: dict[tuple, LedgerGroup] = {}
    for key in sorted(by_seed, key=order.key):
        study, method, ablation, seed = key
        where = tuple(by_seed[key])
        join = (order.phase(key), study, method, ablation, where) if merge_seeds else key
        if join in groups:
            groups[join] = replace(groups[join], seeds=(*groups[join].seeds, seed))
        else:
            groups[join] = LedgerGroup(method, ablation, (seed,), where, study)
    return list(groups.values())


class _GroupOrder:
    """The phases of :func:`ledger_groups` (its docstring), and the order within them."""

    def __init__(
        self,
        todo: Sequence[LedgerCell],
        states: Sequence[CellState],
        by_seed: dict[GroupKey, list[str]],
        merge_seeds: bool,
    ) -> None:
        from flows.studies import LEDGER_STUDIES

        self.tables = LEDGER_STUDIES
        self.merge_seeds = merge_seeds
        done = [s.cell for s in states if s.state == "recorded"]
        recorded = {(c.method, c.system) for c in done if not c.study}
        # a study's row (method and variant) on a system, with a recorded seed
        rows = {(c.study, c.method, c.ablation, c.system) for c in done if c.study}
        predates = {s.cell.key for s in states if s.state == "predates"}
        # groups of retrained predating records
        self.again = {(c.study, c.method, c.ablation, c.seed) for c in todo if c.key in predates}
        self.first: dict[str, int] = {}  # a Table 3 method's first seed with a system to fill
        # a study row's first seed with a system to fill: once every system of a row has a
        # seed, its other seeds wait for every other table's first (phase 2.5, not 1.5)
        self.study_first: dict[tuple[str, str, str], int] = {}
        for (study, method, ablation, seed), systems in sorted(by_seed.items()):
            if study:
                if any((study, method, ablation, s) not in rows for s in systems):
                    self.study_first.setdefault((study, method, ablation), seed)
            elif not ablation and any((method, s) not in recorded for s in systems):
                self.first.setdefault(method, seed)

    def phase(self, key: GroupKey) -> float:
        study, method, ablation, seed = key
        first, merge = self.first, self.merge_seeds
        if study:
            return 1.5 if self.study_first.get(key[:3]) == seed or merge else 2.5
        if method in PEERS and not ablation:  # after all of Table 3, its ablations and studies
            if merge:
                return 3 if method in first else 4
            return 3 if first.get(method) == seed else 4
        if ablation:
            return 1
        if key in self.again and first.get(method) != seed:
            return 0.5
        if merge:  # its first seed comes with the others, in one pack
            return 0 if method in first else 2
        return 0 if first.get(method) == seed else 2

    def key(self, key: GroupKey) -> tuple:
        study, method, ablation, seed = key  # the paper's row order within a seed
        table = self.tables.index(study) + 1 if study in self.tables else 0
        row = METHODS.index(method) if method in METHODS else len(METHODS)
        phase = self.phase(key)
        if phase == 1.5:  # one table's first seed whole before the next table's
            return (phase, table, seed, ablation, row, method)
        return (phase, seed, table, ablation, row, method)


def selected_states(
    ledger: Path, scope: LedgerScope, selection: dict[str, Any]
) -> tuple[list[LedgerCell], list[CellState]]:
    cells = scope.select(
        selection.get("systems"),
        selection.get("methods"),
        selection.get("seeds"),
        ablations=selection.get("ablations"),
        peers=selection.get("peers"),
        studies=selection.get("studies", False),
    )
    return cells, cell_states(read_ledger(ledger, scope), cells)


def measured_twins(
    ledger: Path,
    selection: dict[str, Any],
    todo: Sequence[LedgerCell],
    say: Callable[[str], None] | None = None,
) -> list[LedgerCell]:
    """The cells of the studies that measure a trained model (the CMI of a Table 3 cell, the
    NFEs of a solvers cell) whose config is one of ``todo``'s and whose record the ledger lacks,
    whether ``selection`` asks for the studies or not: ``ledger run`` measures them from the run
    it makes for that config (:class:`flows.ledger.run.Recorder`). Left for later, they would be
    trained again: the store that holds the run does not outlive its machine."""
    if not todo:
        return []
    hashes = {c.config_hash for c in todo}
    wider = {**selection, "studies": True}
    _, states = selected_states(ledger, selection_scope(wider, say, ledger=ledger), wider)
    return [
        s.cell
        for s in states
        if s.cell.measure and s.state != "recorded" and s.cell.config_hash in hashes
    ]


def ledger_states(ledger: Path, selection: dict[str, Any]) -> list[CellState]:
    """The states of the selected cells in ``ledger`` (``selection`` as :func:`run_ledger`'s)."""
    return selected_states(ledger, selection_scope(selection, ledger=ledger), selection)[1]


def selection_scope(
    selection: dict[str, Any],
    say: Callable[[str], None] | None = None,
    *,
    ledger: Path | None = None,
) -> LedgerScope:
    """The ledger's scope of ``selection`` (:func:`tasks.ledger.ledger_scope`; with the
    studies' cells when it asks for any), with today's numerics for the cells ``ledger`` holds
    records of (None: for every cell)."""
    where = (selection.get("config_file"), selection.get("systems"), selection.get("methods"))
    studies = None
    if selection.get("studies", False) is not False:
        from flows.studies import study_cells

        studies = study_cells()
    profile = selection_profile(selection)
    return ledger_scope(*where, say=say, profile=profile, studies=studies, ledger=ledger)


def selection_profile(selection: dict[str, Any]) -> str:
    """The selection's ledger profile (:data:`tasks.ledger.scope.LEDGER_PROFILES`)."""
    return selection.get("profile") or "paper"


def profile_of(selection: dict[str, Any]) -> dict[str, Any]:
    return {"config_file": selection.get("config_file"), "profile": selection_profile(selection)}


def group_config(
    group: LedgerGroup, selection: dict[str, Any], execution: dict[str, Any]
) -> RunConfig:
    """The benchmark config of ``group``: the ledger's profile on its systems, method and
    seeds, with its ablation's model settings or its study variant's settings
    (:func:`tasks.ledger.variants.variant_overrides`)."""
    layers = (
        variant_overrides(group.method, group.ablation)
        if group.study
        else {"models": ABLATIONS.get(group.ablation)}
    )
    return paper_config(
        execution,
        **profile_of(selection),
        systems=list(group.systems),
        methods=[group.method],
        seeds=list(group.seeds),
        **layers,
    )


def recorded_seconds(
    group: LedgerGroup,
    config: RunConfig,
    records: Sequence[LedgerRecord],
    *,
    packable: Callable[[CellConfig], bool] | None = None,
) -> float | None:
    """The seconds the benchmark ``config`` of ``group`` is expected to take on the CPU, from
    the ledger's ``records`` (:func:`~flows.ledger._budget.expected_seconds`: the engine's CPU
    packs of it, on its workers, at most one per core); None on a GPU, where the records do not
    tell (packs in lanes add up, and a record is one pack's time), or without records of the
    method. A study's variant without records of its own is expected from the method's own
    cells, scaled by the training it does (:func:`training_work`) and, where it solves with
    another ODE solver than they do, by that solver's epoch against theirs
    (:func:`solver_factors`: an adaptive solve through the adjoint costs many Euler steps).
    ``packable``: as :func:`tasks.engine.make_packs` takes it (a memo, for many groups)."""
    import torch  # (not at import: the ledger's quick commands do without it)

    from tasks.engine import make_packs

    ex = config.execution
    if ex.device != "cpu" and torch.cuda.is_available():
        return None
    packs = [[c.system for c in p] for p in make_packs(config.cells(), ex.pack, packable=packable)]
    where = ("cpu", hardware_name("cpu"), cpu_workers(config))
    alike = same_settings(config, records)
    seconds = expected_seconds(packs, group.method, group.ablation, records, *where, alike=alike)
    if seconds is not None or not (group.study and group.ablation):
        return seconds
    system = config.cells()[0].system
    profile = paper_config(profile=config.profile, systems=[system], methods=[group.method])
    alike = same_settings(profile, records)
    plain = expected_seconds(packs, group.method, "", records, *where, alike=alike)
    if plain is None:
        return None
    ratio = training_work(config, system) / training_work(profile, system)
    ratio *= solver_cost(config, system) / solver_cost(profile, system)
    return FIXED_SECONDS + (plain - FIXED_SECONDS) * ratio


def same_settings(config: RunConfig, records: Sequence[LedgerRecord]) -> frozenset[str]:
    """The config hashes ``config`` gives its methods' cells on every system and seed that
    ``records`` hold of them: the records made with its settings (its protocol, ablation or
    variant) whatever their seed or system, apart from the same methods' records of other
    settings (another protocol's, which the ledger keeps too)."""
    from tasks.config import SYSTEM_NAMES

    known = {*SYSTEM_NAMES, *config.define_systems}
    mine = [r for r in records if r.method in config.methods and r.system in known]
    if not mine:
        return frozenset()
    wider = config.model_copy(
        update={
            "systems": tuple(sorted({r.system for r in mine})),
            "seeds": tuple(sorted({r.seed for r in mine})),
        }
    )
    return frozenset(c.config_hash() for c in wider.cells())


def solver_factors(path: Path | None = None) -> dict[tuple[str, str], float]:
    """(method, solver) → its seconds per epoch over the same method's with Euler, from the
    committed wall-clock measurement of the paper's Table 11 (``path``, default
    ``results/measurements/wallclock.json``: each model at the paper profile's settings); empty
    without it. Read once per file state."""
    table = _measurement("wallclock.json", path)
    if table is None:
        return {}
    rows = _columns(table, "method", "solver", "value")
    seconds = {(method, solver): _number(table, v) for method, solver, v in rows}
    return {
        (method, solver): value / seconds[method, "euler"]
        for (method, solver), value in seconds.items()
        if solver not in ("euler", "–") and seconds.get((method, "euler"))
    }


#: the cells (systems × seeds) a ledger projection's column holds
#: (``benchmarks/ledger_projection.py``: 5 seeds of the six systems, at the paper's 1000 epochs)
PROJECTED_CELLS = 5 * 6


def projected_cell_seconds(method: str, path: Path | None = None) -> tuple[float, str] | None:
    """A paper-profile cell of ``method`` (1000 epochs) in CPU seconds on one thread, and the
    processor that measured it, from the committed projection of the ledger's columns
    (``path``, default ``results/measurements/ledger_projection.json``, written by
    ``benchmarks/ledger_projection.py --record``: a column's CPU hours over its
    :data:`PROJECTED_CELLS` cells); None without that record or without the method in it.
    Training epochs only (no simulation, tracking or evaluation): an estimate for a method the
    ledger has no record of yet, not a record."""
    table = _measurement("ledger_projection.json", path)
    if table is None:
        return None
    hours = {m: h for m, h in _columns(table, "method", "CPU h per column")}
    if method not in hours:
        return None
    processor = table.machine.split(", ", 1)[0]  # (record_measurement: "NAME, N cores, load …")
    return _number(table, hours[method]) * 3600.0 / PROJECTED_CELLS, processor


def _measurement(name: str, path: Path | None) -> Measurement | None:
    """The committed measurement ``results/measurements/NAME`` (or ``path``), read once per
    file state; None where it is absent."""
    from tasks.reports.measurements import FOLDER

    path = FOLDER / name if path is None else path
    try:
        stat = path.stat()
    except OSError:
        return None
    return _read_measurement(path, (stat.st_mtime_ns, stat.st_size))


def _columns(table: Measurement, *names: str) -> list[tuple[str, ...]]:
    """The rows of ``table`` cut to its columns ``names``, in that order; a ``ValueError``
    naming the record and the command that writes it where one is missing."""
    missing = [n for n in names if n not in table.columns]
    if missing:
        raise ValueError(
            f"the measurement {table.name!r} has no column {', '.join(map(repr, missing))} "
            f"(its columns: {', '.join(table.columns)}); write it again: {table.command}"
        )
    at = [table.columns.index(n) for n in names]
    return [tuple(row[i] for i in at) for row in table.rows]


def _number(table: Measurement, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(
            f"the measurement {table.name!r} holds {value!r} where a number belongs; write it "
            f"again: {table.command}"
        ) from None


@lru_cache(maxsize=8)
def _read_measurement(path: Path, stamp: tuple[int, int]) -> Measurement:
    from tasks.reports.measurements import read_measurement

    return read_measurement(path)


def solver_cost(config: RunConfig, system: str) -> float:
    """An epoch's cost of ``config``'s cell of ``system`` for its ODE solver alone, against the
    same model's with Euler (:func:`solver_factors`; 1 for Euler and for a model without one)."""
    cell = next(c for c in config.cells() if c.system == system)
    solver = str(cell.model.get("solver", "euler"))
    return solver_factors().get((cell.method, solver), 1.0)


def training_work(config: RunConfig, system: str) -> float:
    """How much training a cell of ``system`` in ``config`` does, for scaling a training time:
    its training trajectories × its epochs."""
    cell = next(c for c in config.cells() if c.system == system)
    return float(config.split_sizes(system)[0] * cell.training.epochs)


def cpu_workers(config: RunConfig) -> int:
    """The packs ``config`` trains at once on the CPU: its workers, at most one per core (more
    would finish no sooner)."""
    from tasks.machine import usable_cores

    return min(config.execution.max_workers, usable_cores())
