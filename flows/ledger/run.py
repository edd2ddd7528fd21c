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

import hashlib
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.ledger._budget import (
    deadline,
    fitting_parts,
    needed_seconds,
)
from flows.ledger._progress import ProgressReports, training_now
from flows.ledger.groups import LedgerGroup
from flows.ledger.plan import (
    cpu_workers,
    group_config,
    ledger_groups,
    measured_twins,
    profile_of,
    recorded_seconds,
    selected_states,
    selection_scope,
    to_train,
)
from tasks.ledger import (
    LedgerCell,
    LedgerRecord,
    append_records,
    cell_states,
    hardware_name,
    numerics_of,
    paper_config,
    read_ledger,
    record_of_run,
)
from tasks.ledger.measured import Measured
from tasks.tracking.tags import RunTags

if TYPE_CHECKING:
    from tasks.config import CellConfig
    from tasks.results import CellResult
    from tasks.tracking import CellClaims, Queries

__all__ = [
    "REPORT_SECONDS",
    "LedgerRun",
    "Recorder",
    "record_finished",
    "record_store",
    "run_ledger",
    "training_now",
]


def record_finished(
    queries: Queries,
    cells: Sequence[LedgerCell],
    ledger: Path,
    hardware: Callable[[str], str],
    measure: Callable[[LedgerCell, str], Measured] | None = None,
) -> list[LedgerRecord]:
    """Append the records of ``cells`` that have a FINISHED run in the store; returns them.
    A cell of a study that measures its model (:attr:`tasks.ledger.LedgerCell.measure`) is
    recorded with ``measure(cell, run_id)`` (its numbers and curves), and only where it is
    given."""
    by_hash: dict[str, list[LedgerCell]] = {}
    for c in cells:
        if not c.measure or measure is not None:
            by_hash.setdefault(c.config_hash, []).append(c)
    found = queries.finished_cells(by_hash)
    records = [
        record_of_run(
            c,
            r.run_id,
            r.metrics,
            r.tags,
            hardware=hardware(r.tags.get("device_used", "")),
            numerics=numerics_of(*(r.tags.get(k) for k in _NUMERICS_TAGS)),
            measured=measure(c, r.run_id) if c.measure and measure is not None else None,
        )
        for h, r in found.items()
        if r.test_rmse is not None
        for c in by_hash[h]
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
    #: of ``appended``, the records of study cells outside ``todo`` measured from the runs of
    #: the cells they share a config with (:func:`flows.ledger.plan.measured_twins`)
    twins: int = 0


def record_store(
    ledger: Path, *, selection: dict[str, Any], execution: dict[str, Any]
) -> list[LedgerRecord]:
    """Record the selected cells that the tracking store holds FINISHED and the ledger lacks
    at today's config (after a plain ``nllab benchmark --profile paper``, or a run that was
    killed); trains nothing."""
    from tasks.tracking import connect

    _, states = selected_states(ledger, selection_scope(selection, ledger=ledger), selection)
    todo = to_train(states)
    if not todo:
        return []
    queries = connect(paper_config(execution, **profile_of(selection)).tracking)
    twins = measured_twins(ledger, selection, todo)
    recorder = Recorder(
        queries.queries, ledger, LedgerRun(), lambda _: None, selection, [*todo, *twins]
    )
    recorder.record(todo)
    return recorder.out.appended


def checkpoint_folder(ledger: Path) -> Path:
    """Where ``ledger run`` keeps its cells' training checkpoints by default: ``checkpoints/``
    beside the ledger file (committed with it, a run stopped at a session's end resumes in the
    next)."""
    return ledger.resolve().parent / "checkpoints"


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
    """Train the selected ledger cells without a record at today's config (and, with
    ``refresh_older``, those recorded by older numerics), appending each as its pack finishes.

    ``selection``: ``profile`` (``paper``, the default, or ``fair``), ``config_file`` (layered
    on it), ``systems``, ``methods``, ``seeds`` (None: all), ``ablations`` (False: Table 3
    only, True: the ablations only, None: both), ``peers`` (False: none, True: the peers'
    only, None, the default: theirs too) and ``studies`` (False, the default: none, True: every
    study's too, names: those studies' only; :meth:`tasks.ledger.LedgerScope.select`).
    ``execution``: the benchmark's execution settings (max_workers, torch_threads, device...).
    ``max_seconds``: the time limit; when it is reached the running cells stop (KILLED, not
    recorded) and no group starts after it; a group expected to take longer than the time left
    (from the ledger's records of its method on this kind of device) is not started. ``stop``:
    the caller's own stop event (a signal handler's): setting it stops the run as the time limit
    does (:attr:`tasks.cell.CellRuntime.stop`). ``report_seconds``: how often to say where the
    running cells stand (None: never). The CPU priority is the caller's (``--nice``)."""
    from tasks.tracking import connect

    scope = selection_scope(selection, say, ledger=ledger)
    _, states = selected_states(ledger, scope, selection)
    todo = to_train(states, refresh_older=refresh_older)
    out = LedgerRun(todo=len(todo))
    if not todo:
        return out
    queries = connect(paper_config(execution, **profile_of(selection)).tracking)
    selected = {c.key for c in todo}
    twins = [t for t in measured_twins(ledger, selection, todo, say) if t.key not in selected]
    recorder = Recorder(
        queries.queries, ledger, out, say, selection, [*todo, *twins], refresh_older
    )
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
        _train_in_order(
            groups, todo, left, ledger, selection, execution, recorder, stop, queries.claims
        )
    out.stopped = stop.is_set()
    out.twins = sum(t.key in recorder.done for t in twins)
    if timed_out.is_set():
        say(f"ledger: time limit reached after {(time.monotonic() - t0) / 60:.1f} min")
    return out


def _train_in_order(
    groups: Sequence[LedgerGroup],
    todo: Sequence[LedgerCell],
    left: Callable[[], float | None],
    ledger: Path,
    selection: dict[str, Any],
    execution: dict[str, Any],
    recorder: Recorder,
    stop: threading.Event,
    claims: CellClaims,
) -> None:
    """Each group in turn, cut to what fits the time ``left()`` (:func:`_what_fits`), until
    ``stop``; a group whose cells were all recorded meanwhile (a study's measured twins,
    recorded with the cells they share a run with) is passed over.

    Several runs on one tracking store (one per core with ``--max-workers 1``, or on other
    machines) share the ledger's order: each claims a group in the store before it trains it
    (:func:`_next_free`), and a group another run holds or is training cells of waits until no
    other group is free, instead of one run waiting on the other's cell claims."""
    out, say = recorder.out, recorder.say
    queue, later = list(groups), set()
    while queue:
        if stop.is_set():
            return
        with ExitStack() as claim:
            i, passed = _next_free(queue, todo, recorder.queries, claims, claim)
            for g in passed:
                if g.label not in later:
                    later.add(g.label)
                    say(f"ledger: {g.label} later: another run is training it")
            whole = queue.pop(i)
            for group, needed in _what_fits(whole, left(), ledger, selection, execution, out, say):
                cells = [c for c in todo if group.holds(c)]
                # what another run finished of it meanwhile is recorded (or was), not trained
                recorder.record(cells)
                recorder.done |= recorder.held(cells)
                if {c.key for c in cells} <= recorder.done:
                    continue
                if not _may_start(group, needed, left(), stop, out, say):
                    break
                _train_group(group, cells, selection, execution, recorder, stop)


def _next_free(
    queue: Sequence[LedgerGroup],
    todo: Sequence[LedgerCell],
    queries: Queries,
    claims: CellClaims,
    claim: ExitStack,
) -> tuple[int, Sequence[LedgerGroup]]:
    """The index in ``queue`` of the first group none of whose cells has a RUNNING run in the
    store (another process training it) and whose claim this process gets (held in ``claim``,
    with its heartbeat, until the caller leaves it), and the groups before it; 0, unclaimed,
    when there is none (the engine then waits on the other processes' cell claims and reuses
    what they finish). A group's claim is a cell claim (:class:`~tasks.tracking.CellClaims`:
    one owner wins, whoever else tries at the same moment) on the hash of its cells' config
    hashes: the cells' own runs appear only once the benchmark has started."""
    from tasks.tracking.processes import claim_owner

    running = queries.running_cells({c.config_hash for c in todo})
    held = [c for c in todo if c.config_hash in running]
    owner = claim_owner()
    for i, group in enumerate(queue):
        if any(group.holds(c) for c in held):
            continue
        mine = [c.config_hash for c in todo if group.holds(c)]
        if claim.enter_context(claims.cell_claim(group_claim(mine), owner)):
            return i, queue[:i]
    return 0, ()


def group_claim(config_hashes: Iterable[str]) -> str:
    """The key a ledger run claims a group of cells under (:func:`_next_free`): one for the
    same cells whatever their order, apart from every cell's own claim."""
    return "ledger-" + hashlib.sha256(",".join(sorted(config_hashes)).encode()).hexdigest()[:40]


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


class Recorder:
    """Appends to the ledger what the store has finished of some cells (the engine's hook),
    with what their study measures of the trained model (:func:`flows.studies.measure_cell`).
    A cell to record brings along the ``todo`` cells of studies that measure the same config's
    model (the CMI of a Table 3 cell): measured now, from the run just made, not retrained
    later."""

    def __init__(
        self,
        queries: Queries,
        ledger: Path,
        out: LedgerRun,
        say: Callable,
        selection: dict[str, Any] | None = None,
        todo: Sequence[LedgerCell] = (),
        refresh_older: bool = False,
    ) -> None:
        self.queries, self.ledger, self.out, self.say = queries, ledger, out, say
        self.selection, self.refresh_older = selection or {}, refresh_older
        self.done: set[tuple[str, str, str, str, int]] = set()
        self.measured_twins: dict[str, list[LedgerCell]] = {}
        for c in todo:
            if c.measure:
                self.measured_twins.setdefault(c.config_hash, []).append(c)

    def measure(self, cell: LedgerCell, run_id: str) -> Measured:
        from flows.studies import measure_cell

        group = LedgerGroup(cell.method, cell.ablation, (cell.seed,), (cell.system,), cell.study)
        (config,) = group_config(group, self.selection, {}).cells()
        return measure_cell(cell.study, config, run_id, self.queries)

    def held(self, cells: Sequence[LedgerCell]) -> set[tuple[str, str, str, str, int]]:
        """The keys of ``cells`` the ledger file counts now (another run recorded them
        meanwhile): those :func:`~flows.ledger.plan.to_train` no longer gives under the
        counting rule (:func:`tasks.ledger.cell_states`), as this run chose its cells at its
        start (``refresh_older``)."""
        states = cell_states(read_ledger(self.ledger), cells)
        left = {c.key for c in to_train(states, refresh_older=self.refresh_older)}
        return {c.key for c in cells} - left

    def record(self, cells: Sequence[LedgerCell]) -> None:
        twins = [t for c in cells for t in self.measured_twins.get(c.config_hash, ())]
        cells = list({c.key: c for c in [*cells, *twins] if c.key not in self.done}.values())
        for r in record_finished(self.queries, cells, self.ledger, hardware_name, self.measure):
            self.out.appended.append(r)
            self.done.add((r.system, r.method, r.study, r.ablation, r.seed))
            self.say(f"ledger: recorded {r.cell_key}: test RMSE {r.test_rmse:.4g} (run {r.run_id})")


def _train_group(
    group: LedgerGroup,
    cells: Sequence[LedgerCell],
    selection: dict[str, Any],
    execution: dict[str, Any],
    recorder: Recorder,
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


def _same_cells(configs: Sequence[CellConfig], by_hash: dict[str, LedgerCell]) -> None:
    """The benchmark's cells are the ledger's (else the cached scope is stale: a bug)."""
    missing = [c.key for c in configs if c.config_hash() not in by_hash]
    if missing:
        raise RuntimeError(
            f"the ledger's cached cells do not match today's config for {', '.join(missing)}; "
            "delete the ledger folders of datasets.cache_folders (beside the installation, and "
            "$NLLAB_HOME/ledger) and run again"
        )
