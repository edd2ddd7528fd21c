"""Fill the results ledger: train the ledger's missing cells through the benchmark.

Cells go through :func:`flows.benchmark.run_benchmark`, so they are tracked in MLflow and reused
from the store like any benchmark's. The engine's cell-finished hook
(:func:`tasks.engine.run_cells`) appends each finished cell's record to the ledger as its pack
ends (:func:`tasks.ledger.append_records`), so a run that is stopped or killed keeps every cell
that finished; the next ``ledger run`` first records what the store finished meanwhile, then
trains only what is still missing. A time limit stops through the engine's one stop path
(:attr:`tasks.cell.CellRuntime.stop`): running cells end KILLED and are not recorded, finished
ones stay, and no group starts after it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows._ledger_budget import (
    ESTIMATE_MARGIN,
    FIXED_SECONDS,
    deadline,
    expected_seconds,
    fitting_parts,
    needed_seconds,
    speed_ratios,
)
from flows._ledger_progress import ProgressReports, training_now
from tasks.config import METHODS
from tasks.ledger import (
    LedgerRecord,
    append_records,
    hardware_name,
    numerics_of,
    read_ledger,
    record_of_run,
)
from tasks.ledger_scope import (
    ABLATIONS,
    PEERS,
    LedgerCell,
    LedgerScope,
    ledger_scope,
    paper_config,
)
from tasks.ledger_views import CellState, cell_states
from tasks.tracking.tags import RunTags

if TYPE_CHECKING:
    from tasks.config import CellConfig, RunConfig
    from tasks.results import CellResult
    from tasks.tracking import Queries

__all__ = [
    "ESTIMATE_MARGIN",
    "FIXED_SECONDS",
    "REPORT_SECONDS",
    "LedgerGroup",
    "LedgerRun",
    "cpu_workers",
    "expected_seconds",
    "fitting_parts",
    "group_config",
    "ledger_groups",
    "ledger_states",
    "paper_config",
    "record_finished",
    "record_store",
    "recorded_seconds",
    "run_ledger",
    "speed_ratios",
    "to_train",
    "training_now",
]


@dataclass(frozen=True)
class LedgerGroup:
    """Cells trained by one benchmark: every system × seed of one method (and ablation)."""

    method: str
    ablation: str
    seeds: tuple[int, ...]
    systems: tuple[str, ...]

    @property
    def label(self) -> str:
        what = f"{self.method} ({self.ablation})" if self.ablation else self.method
        seeds = ",".join(map(str, self.seeds))
        return (
            f"{what} seed{'s' if len(self.seeds) > 1 else ''} {seeds} on {', '.join(self.systems)}"
        )

    @property
    def size(self) -> int:
        """Its cells: systems × seeds."""
        return len(self.systems) * len(self.seeds)

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


def to_train(states: Sequence[CellState], *, refresh_older: bool = False) -> list[LedgerCell]:
    """The cells ``ledger run`` trains: those with no record at today's config; with
    ``refresh_older``, also those whose counted record older numerics made."""
    return [
        s.cell for s in states if s.state != "recorded" or (refresh_older and s.numerics == "older")
    ]


def ledger_groups(
    todo: Sequence[LedgerCell], states: Sequence[CellState], *, merge_seeds: bool = False
) -> list[LedgerGroup]:
    """``todo`` as benchmark runs, in the order that gives every column a figure first:

    1. for each Table 3 method with a system that has no recorded seed, its lowest missing seed;
    2. the cells whose records predate numerics fingerprints (they count for nothing until
       retrained: a column the ledger had once comes back whole before new seeds), then the
       ablations (so they start only once every Table 3 column has at least one seed);
    3. the remaining Table 3 seeds, seed by seed;
    4. then the Laplace-domain peers (:data:`tasks.ledger_scope.PEERS`, not Table 3's): each
       one's lowest missing seed, then their remaining seeds, seed by seed.

    Each group is one seed of one method on its missing systems; ``merge_seeds`` (a GPU, where
    bigger packs pay) joins the seeds of one method that miss the same systems, a method
    without any seed in phase 1 with all of them."""
    recorded = {(s.cell.method, s.cell.system) for s in states if s.state == "recorded"}
    predates = {s.cell.key for s in states if s.state == "predates"}
    by_seed: dict[tuple[str, str, int], list[str]] = {}
    again: set[tuple[str, str, int]] = set()  # groups of retrained predating records
    for c in todo:
        by_seed.setdefault((c.method, c.ablation, c.seed), []).append(c.system)
        if c.key in predates:
            again.add((c.method, c.ablation, c.seed))
    first: dict[str, int] = {}
    for (method, ablation, seed), systems in sorted(by_seed.items()):
        if not ablation and any((method, s) not in recorded for s in systems):
            first.setdefault(method, seed)

    def phase(key: tuple[str, str, int]) -> float:
        method, ablation, seed = key
        if method in PEERS and not ablation:  # after all of Table 3 and the ablations
            if merge_seeds:
                return 3 if method in first else 4
            return 3 if first.get(method) == seed else 4
        if ablation:
            return 1
        if key in again and first.get(method) != seed:
            return 0.5
        if merge_seeds:  # its first seed comes with the others, in one pack
            return 0 if method in first else 2
        return 0 if first.get(method) == seed else 2

    def order(key: tuple[str, str, int]) -> tuple:
        method, ablation, seed = key  # the paper's row order within a seed
        row = METHODS.index(method) if method in METHODS else len(METHODS)
        return (phase(key), seed, ablation, row, method)

    groups: dict[tuple, LedgerGroup] = {}
    for key in sorted(by_seed, key=order):
        method, ablation, seed = key
        where = tuple(by_seed[key])
        join = (phase(key), method, ablation, where) if merge_seeds else key
        if join in groups:
            groups[join] = replace(groups[join], seeds=(*groups[join].seeds, seed))
        else:
            groups[join] = LedgerGroup(method, ablation, (seed,), where)
    return list(groups.values())


def record_finished(
    queries: Queries, cells: Sequence[LedgerCell], ledger: Path, hardware: Callable[[str], str]
) -> list[LedgerRecord]:
    """Append the records of ``cells`` that have a FINISHED run in the store; returns them."""
    by_hash = {c.config_hash: c for c in cells}
    found = queries.finished_cells(by_hash)
    records = [
        record_of_run(
            by_hash[h],
            r.run_id,
            r.metrics,
            r.tags,
            hardware=hardware(r.tags.get("device_used", "")),
            numerics=numerics_of(*(r.tags.get(k) for k in _NUMERICS_TAGS)),
        )
        for h, r in found.items()
        if r.test_rmse is not None
    ]
    return append_records(ledger, records)


#: A run's tags that make its record's ``numerics`` (:func:`tasks.ledger.numerics_of`).
_NUMERICS_TAGS = (RunTags.NUMERICS_MODEL, RunTags.NUMERICS_SYSTEM, RunTags.NUMERICS_DEVICE)

#: How often ``ledger run`` says where its running cells stand (seconds; its ``--report-minutes``).
REPORT_SECONDS = 600.0


@dataclass
class LedgerRun:
    """What one ``ledger run`` did."""

    todo: int = 0
    appended: list[LedgerRecord] = field(default_factory=list)
    stopped: bool = False  # the time limit (or the caller's stop event) ended it
    failed: list[str] = field(default_factory=list)
    #: groups left out because their expected time exceeded what was left
    skipped: list[str] = field(default_factory=list)


def _states(
    ledger: Path, scope: LedgerScope, selection: dict[str, Any]
) -> tuple[list[LedgerCell], list[CellState]]:
    cells = scope.select(
        selection.get("systems"),
        selection.get("methods"),
        selection.get("seeds"),
        ablations=selection.get("ablations"),
        peers=selection.get("peers"),
    )
    return cells, cell_states(read_ledger(ledger, scope), cells)


def ledger_states(ledger: Path, selection: dict[str, Any]) -> list[CellState]:
    """The states of the selected cells in ``ledger`` (``selection`` as :func:`run_ledger`'s)."""
    return _states(ledger, _scope(selection), selection)[1]


def _scope(selection: dict[str, Any], say: Callable[[str], None] | None = None) -> LedgerScope:
    where = (selection.get("config_file"), selection.get("systems"), selection.get("methods"))
    return ledger_scope(*where, say=say, profile=_profile(selection))


def _profile(selection: dict[str, Any]) -> str:
    """The selection's ledger profile (:data:`tasks.ledger_scope.LEDGER_PROFILES`)."""
    return selection.get("profile") or "paper"


def _profile_file(selection: dict[str, Any]) -> dict[str, Any]:
    return {"config_file": selection.get("config_file"), "profile": _profile(selection)}


def record_store(
    ledger: Path, *, selection: dict[str, Any], execution: dict[str, Any]
) -> list[LedgerRecord]:
    """Record the selected cells that the tracking store holds FINISHED and the ledger lacks
    at today's config (after a plain ``nllab benchmark --profile paper``, or a run that was
    killed); trains nothing."""
    from tasks.tracking import connect

    _, states = _states(ledger, _scope(selection), selection)
    todo = to_train(states)
    if not todo:
        return []
    queries = connect(paper_config(execution, **_profile_file(selection)).tracking)
    return record_finished(queries.queries, todo, ledger, hardware_name)


def run_ledger(
    ledger: Path,
    *,
    selection: dict[str, Any],
    execution: dict[str, Any],
    max_seconds: float | None = None,
    refresh_older: bool = False,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = print,
    report_seconds: float | None = REPORT_SECONDS,
) -> LedgerRun:
    """Train the selected ledger cells that have no record at today's config (and, with
    ``refresh_older``, those recorded by older numerics), appending each record as its pack
    finishes.

    ``selection``: ``profile`` (``paper``, the default, or ``fair``), ``config_file`` (layered
    on it), ``systems``, ``methods``, ``seeds`` (None: all), ``ablations`` (False: Table 3
    only, True: the ablations only, None: both) and ``peers`` (False: none, True: the peers'
    only, None, the default: theirs too; :meth:`tasks.ledger_scope.LedgerScope.select`).
    ``execution``: the benchmark's execution settings (max_workers, torch_threads, device...).
    ``max_seconds``: the time limit; when it is reached the running cells stop (KILLED, not
    recorded) and no group starts after it; a group expected to take longer than the time left
    (from the ledger's records of its method on this kind of device) is not started. ``stop``:
    the caller's own stop event (a signal handler's): setting it stops the run as the time limit
    does (:attr:`tasks.cell.CellRuntime.stop`). ``report_seconds``: how often to say where the
    running cells stand (None: never). The CPU priority is the caller's (``--nice``)."""
    from tasks.tracking import connect

    scope = _scope(selection, say)
    _, states = _states(ledger, scope, selection)
    todo = to_train(states, refresh_older=refresh_older)
    out = LedgerRun(todo=len(todo))
    if not todo:
        return out
    queries = connect(paper_config(execution, **_profile_file(selection)).tracking)
    recorder = _Recorder(queries.queries, ledger, out, say)
    recorder.record(todo)  # cells a stopped run finished in this store meanwhile
    todo = [c for c in todo if c.key not in recorder.done]
    device = str(execution.get("device") or "auto")
    groups = ledger_groups(todo, states, merge_seeds=device.startswith("cuda"))
    stop = threading.Event() if stop is None else stop
    timed_out, t0 = threading.Event(), time.monotonic()

    def left() -> float | None:
        return None if max_seconds is None else max_seconds - (time.monotonic() - t0)

    reports = ProgressReports(queries.queries, todo, say, report_seconds)
    with deadline(max_seconds, stop, timed_out), reports:
        for whole in groups:
            if stop.is_set():
                break
            parts = _what_fits(whole, left(), ledger, selection, execution, out, say)
            for group, needed in parts:
                if not _may_start(group, needed, left(), stop, out, say):
                    break
                cells = [c for c in todo if _in(c, group)]
                _train_group(group, cells, selection, execution, recorder, stop)
    out.stopped = stop.is_set()
    if timed_out.is_set():
        say(f"ledger: time limit reached after {(time.monotonic() - t0) / 60:.1f} min")
    return out


def _what_fits(
    group: LedgerGroup,
    left: float | None,
    ledger: Path,
    selection: dict[str, Any],
    execution: dict[str, Any],
    out: LedgerRun,
    say: Callable[[str], None],
) -> Sequence[tuple[LedgerGroup, float | None]]:
    """The parts of ``group`` to train, in order, in the ``left`` seconds (None: no limit, all
    of it), each with the seconds it is expected to need (None: not known); empty (listed in
    ``out.skipped`` and said) when no part is expected to finish.

    The expectation comes from the ledger's records of the method on the CPU
    (:func:`recorded_seconds`: the whole group or nothing); on a GPU or without such records,
    from this machine's measurement of the packs the engine would train (:func:`tasks.engine.
    estimate_packs`), and then the group is cut to the whole packs that fit (:func:`~flows.
    _ledger_budget.fitting_parts`): a short GPU window records some cells, not none."""
    if left is None:
        return [(group, None)]
    config = group_config(group, selection, execution)
    expected = recorded_seconds(group, config, read_ledger(ledger))
    if expected is not None:
        if expected <= left:
            return [(group, expected)]
        _skip(group, f"about {expected / 60:.0f} min, {left / 60:.0f} min left", out, say)
        return []
    from tasks.engine import estimate_packs

    estimates = estimate_packs(config)
    workers = cpu_workers(config)
    parts = fitting_parts(group, estimates, left, workers)
    n_part, n_all = sum(p.size for p, _ in parts), group.size
    if parts and n_part == n_all:
        return parts
    whole = needed_seconds(estimates, workers)  # only said when not all of the group fits
    measured = (
        f"about {whole / 60:.0f} min by this machine's measurement, {left / 60:.0f} min left"
        if math.isfinite(whole)
        else "this machine's probe could not train a pack of it (e.g. out of memory)"
    )
    if not parts:
        _skip(group, measured, out, say)
        return []
    say(f"ledger: {n_part} of {n_all} cells of {group.label} fit ({measured})")
    out.skipped.append(f"{n_all - n_part} of the {n_all} cells of {group.label}")
    return parts


def recorded_seconds(
    group: LedgerGroup, config: RunConfig, records: Sequence[LedgerRecord]
) -> float | None:
    """The seconds the benchmark ``config`` of ``group`` is expected to take on the CPU, from
    the ledger's ``records`` (:func:`~flows._ledger_budget.expected_seconds`: the engine's CPU
    packs of it, on its workers, at most one per core); None on a GPU, where the records do not
    tell (packs in lanes add up, and a record is one pack's time), or without records of the
    method."""
    import torch  # (not at import: the ledger's quick commands do without it)

    from tasks.engine import make_packs

    ex = config.execution
    if ex.device != "cpu" and torch.cuda.is_available():
        return None
    packs = [[c.system for c in p] for p in make_packs(config.cells(), ex.pack)]
    return expected_seconds(
        packs,
        group.method,
        group.ablation,
        records,
        "cpu",
        hardware_name("cpu"),
        cpu_workers(config),
    )


def cpu_workers(config: RunConfig) -> int:
    """The packs ``config`` trains at once on the CPU: its workers, at most one per core (more
    would finish no sooner)."""
    from tasks import usable_cores

    return min(config.execution.max_workers, usable_cores())


def _may_start(
    group: LedgerGroup,
    needed: float | None,
    left: float | None,
    stop: threading.Event,
    out: LedgerRun,
    say: Callable[[str], None],
) -> bool:
    """Whether a part starts (said, with the minutes it is expected to take): not after a stop,
    nor when an earlier part took so long that what is left is less than this one needs (then
    said, and listed as skipped)."""
    if stop.is_set():
        return False
    if needed is not None and left is not None and needed > left:
        _skip(group, f"about {needed / 60:.0f} min, {left / 60:.0f} min left", out, say)
        return False
    expect = f" (about {needed / 60:.0f} min expected)" if needed is not None else ""
    say(f"ledger: training {group.label}{expect}")
    return True


def _skip(group: LedgerGroup, why: str, out: LedgerRun, say: Callable[[str], None]) -> None:
    out.skipped.append(group.label)
    say(f"ledger: not starting {group.label}: {why}")


def _in(cell: LedgerCell, group: LedgerGroup) -> bool:
    return (
        cell.method == group.method
        and cell.ablation == group.ablation
        and cell.seed in group.seeds
        and cell.system in group.systems
    )


class _Recorder:
    """Appends to the ledger what the store has finished of some cells (the engine's hook)."""

    def __init__(self, queries: Queries, ledger: Path, out: LedgerRun, say: Callable) -> None:
        self.queries, self.ledger, self.out, self.say = queries, ledger, out, say
        self.done: set[tuple[str, str, str, int]] = set()

    def record(self, cells: Sequence[LedgerCell]) -> None:
        for r in record_finished(self.queries, cells, self.ledger, hardware_name):
            self.out.appended.append(r)
            self.done.add((r.system, r.method, r.ablation, r.seed))
            self.say(f"ledger: recorded {r.cell_key}: test RMSE {r.test_rmse:.4g} (run {r.run_id})")


def _train_group(
    group: LedgerGroup,
    cells: Sequence[LedgerCell],
    selection: dict[str, Any],
    execution: dict[str, Any],
    recorder: _Recorder,
    stop: threading.Event,
) -> None:
    """One benchmark of ``group``, each pack's finished cells recorded as it ends."""
    from flows.benchmark import run_benchmark

    config = group_config(group, selection, execution)
    by_hash = {c.config_hash: c for c in cells}
    _same_cells(config.cells(), by_hash)

    def finished(results: Sequence[CellResult]) -> None:
        recorder.record([by_hash[h] for r in results if r.ok and (h := r.config_hash)])

    summary = run_benchmark(config, stop=stop, on_finished=finished)
    # cells the store had finished at today's numerics (reused, not trained: no hook call)
    reused = [h for r in summary.results if r.status == "reused" and (h := r.config_hash)]
    recorder.record([by_hash[h] for h in reused])
    recorder.out.failed += [r.key for r in summary.results if r.status == "failed"]


def group_config(
    group: LedgerGroup, selection: dict[str, Any], execution: dict[str, Any]
) -> RunConfig:
    """The benchmark config of ``group``: the ledger's profile on its systems, method and
    seeds."""
    return paper_config(
        execution,
        **_profile_file(selection),
        systems=list(group.systems),
        methods=[group.method],
        seeds=list(group.seeds),
        models=ABLATIONS.get(group.ablation),
    )


def _same_cells(configs: Sequence[CellConfig], by_hash: dict[str, LedgerCell]) -> None:
    """The benchmark's cells are the ledger's (else the cached scope is stale: a bug)."""
    missing = [c.key for c in configs if c.config_hash() not in by_hash]
    if missing:
        raise RuntimeError(
            f"the ledger's cached cells do not match today's config for {', '.join(missing)}; "
            "delete the ledger folders of datasets.cache_folders (beside the installation, and "
            "$NLLAB_HOME/ledger) and run again"
        )
