"""Fill the results ledger: train the paper profile's missing cells through the benchmark.

Cells go through :func:`flows.benchmark.run_benchmark`, so they are tracked in MLflow and reused
from the store like any benchmark's. A watcher thread appends each finished cell's record to the
ledger as soon as its run is FINISHED (:func:`tasks.ledger.append_records`), so a run that is
stopped or killed keeps every cell that finished; the next ``ledger run`` first records what the
store finished meanwhile, then trains only what is still missing.
"""

from __future__ import annotations

import _thread
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.config import CellConfig, RunConfig, resolve_config
from tasks.ledger import (
    LedgerRecord,
    append_records,
    cell_numerics,
    cell_states,
    hardware_name,
    numerics_of,
    read_ledger,
    record_of_run,
)
from tasks.tracking.tags import RunTags

if TYPE_CHECKING:
    from tasks.tracking import Queries

__all__ = [
    "LedgerRun",
    "ledger_groups",
    "paper_config",
    "record_finished",
    "record_store",
    "run_ledger",
]

#: Seconds between two looks at the store for cells that finished.
POLL_SECONDS = 20.0


def paper_config(
    overrides: dict[str, Any] | None = None,
    *,
    config_file: str | Path | None = None,
    **more: Any,
) -> RunConfig:
    """The paper profile (the ledger's protocol), with ``config_file`` layered on it and the
    ``overrides`` (selection, execution; keyword arguments join them) on top."""
    return resolve_config("paper", config_file, {**(overrides or {}), **more})


def ledger_groups(cells: Sequence[CellConfig]) -> list[tuple[int, str, list[str]]]:
    """``cells`` as benchmark runs: (seed, method, systems), seeds in ascending order so that
    whole seeds complete first."""
    groups: dict[tuple[int, str], list[str]] = {}
    for c in cells:
        groups.setdefault((c.seed, c.method), []).append(c.system)
    return [(s, m, systems) for (s, m), systems in sorted(groups.items())]


def record_finished(
    queries: Queries, cells: Sequence[CellConfig], ledger: Path, hardware: Callable[[str], str]
) -> list[LedgerRecord]:
    """Append the records of ``cells`` that have a FINISHED run in the store; returns them."""
    by_hash = {c.config_hash(): c for c in cells}
    found = queries.finished_cells(by_hash)
    records = [
        record_of_run(
            by_hash[h],
            r.run_id,
            r.metrics,
            r.tags,
            hardware=hardware(r.tags.get("device_used", "")),
            numerics=numerics_of(
                r.tags.get(RunTags.NUMERICS_MODEL), r.tags.get(RunTags.NUMERICS_SYSTEM)
            ),
        )
        for h, r in found.items()
        if r.test_rmse is not None
    ]
    return append_records(ledger, records)


def _unrecorded(ledger: Path, selection: dict[str, Any]) -> list[CellConfig]:
    cells = paper_config(**selection).cells()
    states = cell_states(read_ledger(ledger), cells, cell_numerics)
    return [c for c, s in zip(cells, states, strict=True) if s.state != "recorded"]


def record_store(
    ledger: Path, *, selection: dict[str, Any], execution: dict[str, Any]
) -> list[LedgerRecord]:
    """Record the selected cells that the tracking store holds FINISHED and the ledger lacks
    (after a plain ``nllab benchmark --profile paper``, or a run that was killed); trains
    nothing."""
    from tasks.tracking import connect

    todo = _unrecorded(ledger, selection)
    if not todo:
        return []
    queries = connect(paper_config(**selection, **execution).tracking).queries
    return record_finished(queries, todo, ledger, hardware_name)


@dataclass
class LedgerRun:
    """What one ``ledger run`` did."""

    todo: int = 0
    appended: list[LedgerRecord] = field(default_factory=list)
    stopped: bool = False  # the time limit ended it
    failed: list[str] = field(default_factory=list)


@contextmanager
def _watch(check: Callable[[], None], every: float) -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            try:
                check()
            except Exception:  # a busy store: the next look (or the final sweep) records it
                pass

    thread = threading.Thread(target=loop, name="ledger-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def _deadline(hours: float | None, fired: threading.Event) -> Iterator[None]:
    """Interrupt the main thread after ``hours`` (the engine's Ctrl-C path: running cells end
    KILLED, finished ones stay)."""
    if hours is None:
        yield
        return

    def fire() -> None:
        fired.set()
        _thread.interrupt_main()

    timer = threading.Timer(hours * 3600.0, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def run_ledger(
    ledger: Path,
    *,
    selection: dict[str, Any],
    execution: dict[str, Any],
    max_hours: float | None = None,
    niceness: int = 19,
    poll: float = POLL_SECONDS,
    say: Callable[[str], None] = print,
) -> LedgerRun:
    """Train the cells of the paper profile (``selection``: systems, methods, seeds) that the
    ledger does not hold at today's config, appending each record as soon as it finishes.

    ``selection`` may name a ``config_file`` layered on the paper profile.
    ``execution``: the benchmark's execution settings (max_workers, torch_threads, device...).
    ``niceness``: added to this process's (and so its workers') CPU niceness first."""
    from tasks.tracking import connect

    if niceness:
        os.nice(niceness)
    todo = _unrecorded(ledger, selection)
    out = LedgerRun(todo=len(todo))
    if not todo:
        return out
    queries = connect(paper_config(**selection, **execution).tracking).queries
    recorder = _Recorder(
        lambda group: record_finished(queries, group, ledger, hardware_name), out, say
    )
    recorder.sweep(todo)  # cells a stopped run finished in this store meanwhile
    recorded = {(r.system, r.method, r.seed) for r in out.appended}
    todo = [c for c in todo if (c.system, c.method, c.seed) not in recorded]
    fired = threading.Event()
    t0 = time.monotonic()
    try:
        with _deadline(max_hours, fired):
            _train_groups(todo, selection, execution, recorder, poll, say)
    except KeyboardInterrupt:
        if not fired.is_set():
            recorder.sweep(todo)
            raise
        out.stopped = True
        say(f"ledger: --max-hours reached after {(time.monotonic() - t0) / 3600:.2f} h")
    recorder.sweep(todo)
    return out


class _Recorder:
    """Appends to the ledger, one thread at a time, what the store has finished of some cells."""

    def __init__(
        self,
        record: Callable[[Sequence[CellConfig]], list[LedgerRecord]],
        out: LedgerRun,
        say: Callable[[str], None],
    ) -> None:
        self._record, self.out, self._say = record, out, say
        self._lock = threading.Lock()

    def sweep(self, group: Sequence[CellConfig]) -> None:
        with self._lock:
            new = self._record(group)
        for r in new:
            self.out.appended.append(r)
            self._say(
                f"ledger: recorded {r.cell_key}: test RMSE {r.test_rmse:.4g} (run {r.run_id})"
            )


def _train_groups(
    todo: Sequence[CellConfig],
    selection: dict[str, Any],
    execution: dict[str, Any],
    recorder: _Recorder,
    poll: float,
    say: Callable[[str], None],
) -> None:
    """One benchmark per (seed, method) group, its cells recorded while it runs and after."""
    from flows.benchmark import run_benchmark

    for seed, method, systems in ledger_groups(todo):
        group = [c for c in todo if c.seed == seed and c.method == method]
        say(f"ledger: training {method} seed {seed} on {', '.join(systems)}")
        config = paper_config(
            execution,
            config_file=selection.get("config_file"),
            systems=systems,
            methods=[method],
            seeds=[seed],
        )
        with _watch(lambda g=group: recorder.sweep(g), poll):
            summary = run_benchmark(config)
        recorder.sweep(group)
        recorder.out.failed += [r.key for r in summary.results if not r.ok]
