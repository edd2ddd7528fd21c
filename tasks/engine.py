"""The cell engine: the one path from a list of cells to their results.

The benchmark, every study, reproduction and the cells of a tuning trial go through it. Given
cells and a :class:`~tasks.cell.CellRuntime`, :func:`run_cells`

1. reuses every cell that already has a FINISHED run with its config hash (never retrained);
2. simulates each needed data set once, before training starts;
3. groups the rest into packs (cells that differ only in seed: :func:`tasks.cell.pack_key`),
   each trained as one batched model when ``runtime.pack`` is on;
4. fans the packs out over the flow's task runner (threads, worker processes or Dask), one
   Prefect task per pack and one MLflow child run per cell;
5. returns one :class:`~tasks.reporting.CellResult` per input cell, in input order.

It must be called inside a Prefect flow (it submits tasks to the flow's task runner).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from contextlib import nullcontext

import torch
from prefect import get_run_logger
from prefect.futures import PrefectFuture, as_completed, wait
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from tasks._workers import worker_pool_active, worker_processes
from tasks.cell import CellRuntime, pack_key, tell_unusable
from tasks.config import CellConfig, DataConfig
from tasks.prefect_tasks import PackFailed, pack_task, simulate_task
from tasks.reporting import CellResult, stored_result
from tasks.tracking import Tracker

__all__ = ["collect_results", "make_packs", "run_cells", "stored_results"]


def stored_results(
    tracker: Tracker, cells: Sequence[CellConfig]
) -> tuple[list[CellResult], list[CellConfig]]:
    """Split cells into those with a finished run in the store (as results) and those to run.

    A finished run counts only if its model artifact is present and loads
    (:meth:`tasks.tracking.Tracker.reusable_cells`); otherwise its cell is run again and the
    user is told why, in one line per run.
    """
    done, broken = tracker.reusable_cells(c.config_hash() for c in cells)
    reused, todo = [], []
    for c in cells:
        h = c.config_hash()
        rec = done.get(h)
        if rec is None:
            todo.append(c)
            if h in broken:
                tell_unusable(c, *broken[h])
        else:
            reused.append(stored_result(c.system, c.method, c.seed, rec))
    return reused, todo


def _packable(cell: CellConfig) -> bool:
    """Whether the cell's model trains packed (else its seeds are better spread over workers)."""
    from datasets import SYSTEMS
    from nlmodels import build_model
    from tasks.packing import packable

    try:
        model = build_model(cell.method, SYSTEMS[cell.system].state_dim, **cell.model)
    except Exception:
        return False  # the cell fails on its own, with its error, when it runs
    return packable(model, torch.device("cpu"))


def make_packs(cells: Sequence[CellConfig], pack: bool) -> list[list[CellConfig]]:
    """Cells grouped by :func:`~tasks.cell.pack_key` (first-appearance order) where their model
    trains packed (:func:`tasks.packing.packable`); one cell per pack otherwise, or when ``pack``
    is off, so that cells that would train one by one spread over the workers instead."""
    if not pack:
        return [[c] for c in cells]
    groups: dict[str, list[CellConfig]] = {}
    for c in cells:
        groups.setdefault(pack_key(c), []).append(c)
    packs: list[list[CellConfig]] = []
    for group in groups.values():
        packs += [group] if len(group) > 1 and _packable(group[0]) else [[c] for c in group]
    return packs


def _failed(cell: CellConfig, error: str | None = None) -> CellResult:
    return CellResult(
        cell.system, cell.method, cell.seed, "failed", config_hash=cell.config_hash(), error=error
    )


def collect_results(future: PrefectFuture, pack: Sequence[CellConfig]) -> list[CellResult]:
    """The results of a pack's task; a crashed or cancelled task fails each of its cells."""
    try:
        value = future.result(raise_on_failure=False)
    except Exception as e:  # a crashed task whose state has no data
        value = e
    if isinstance(value, PackFailed):
        return list(value.results)
    if isinstance(value, list) and all(isinstance(r, CellResult) for r in value):
        return value
    # The task itself broke (e.g. the tracking store went away mid-cell).
    return [_failed(c, str(value)) for c in pack]


def _data_keys(cells: Iterable[CellConfig]) -> list[tuple[str, DataConfig, int]]:
    seen: dict[str, tuple[str, DataConfig, int]] = {}
    for c in cells:
        seen.setdefault(
            f"{c.system}|{c.data.model_dump_json()}|{c.seed}", (c.system, c.data, c.seed)
        )
    return list(seen.values())


def run_cells(cells: Sequence[CellConfig], runtime: CellRuntime) -> list[CellResult]:
    """Train (or reuse, by config hash) ``cells``: one result per cell, in input order.

    Cells with the same config hash share one run. Failed or interrupted cells are run again next
    time; a failing cell never stops the others. Ctrl-C stops running cells at their next batch
    (their runs end KILLED) and propagates.
    """
    tracker = runtime.tracker
    unique = list({c.config_hash(): c for c in cells}.values())
    reused, todo = stored_results(tracker, unique)
    by_hash: dict[str, CellResult] = {r.config_hash: r for r in reused}
    packs = make_packs(todo, runtime.pack)
    get_run_logger().info(
        "%d cells: %d already finished (reused), %d to run in %d packs, %d at a time; "
        "tracking at %s",
        len(unique),
        len(reused),
        len(todo),
        len(packs),
        runtime.max_workers,
        tracker.settings.tracking_uri,
    )
    if todo:
        wait([simulate_task.submit(s, d, seed) for s, d, seed in _data_keys(todo)])
        isolated = (
            runtime.isolation == "process"
            and runtime.task_runner == "thread"
            and not worker_pool_active()
        )
        pool = worker_processes(runtime.max_workers) if isolated else nullcontext()
        # Log lines (Prefect's, ours) are printed above the progress bars instead of through them.
        quiet_logs = (
            logging_redirect_tqdm(loggers=[logging.getLogger("prefect"), logging.getLogger()])
            if runtime.progress
            else nullcontext()
        )
        bar = tqdm(
            total=len(todo),
            desc="cells",
            unit="cell",
            disable=not runtime.progress,
            position=0,
            leave=True,
        )
        t0 = time.perf_counter()
        try:
            with pool, quiet_logs:
                try:
                    futures = {pack_task.submit(p, runtime): p for p in packs}
                    for fut in as_completed(list(futures)):
                        done = collect_results(fut, futures[fut])
                        for r in done:
                            by_hash[r.config_hash] = r
                        bar.update(len(done))
                        bar.set_postfix(
                            failed=sum(not r.ok for r in by_hash.values()),
                            reused=len(reused),
                            elapsed=f"{time.perf_counter() - t0:.0f}s",
                        )
                except BaseException:
                    # Ctrl-C: before the pool shuts down, so queued cells never start; running
                    # cells stop at their next batch and end KILLED, finished ones stay.
                    if runtime.stop is not None:
                        runtime.stop.set()
                    raise
        finally:
            bar.close()
        for c in todo:
            by_hash.setdefault(c.config_hash(), _failed(c, "the cell's task did not return"))
    return [by_hash[c.config_hash()] for c in cells]
