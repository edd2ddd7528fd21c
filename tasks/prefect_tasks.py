"""Thin Prefect tasks over the plain functions of this package.

Inputs hold live objects (a stop event), so Prefect's input-hash caching is off: a
finished cell is recognised by its config hash in MLflow instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Literal

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.states import Cancelled, Failed, State

from tasks.cell import CellRuntime, run_pack, simulate_data
from tasks.config import CellConfig, DataConfig
from tasks.errors import Interrupted
from tasks.machine.workers import WorkerDied, WorkerStopped, run_in_worker, worker_pool_active
from tasks.reports import plural
from tasks.results import CellResult
from tasks.stopping import abandonable
from tasks.tracking import cell_variant

__all__ = ["PackFailed", "pack_task", "simulate_data_sets", "simulate_task"]

_NOT_STARTED = "interrupted before it started"


@task(name="simulate", task_run_name="simulate {system} seed {seed}", cache_policy=NO_CACHE)
def simulate_task(
    system: str, data: DataConfig, seed: int, stop: threading.Event | None = None
) -> str | State:
    """Simulate (or load from the cache) one data set; returns its fingerprint.

    The simulator may be the user's: it runs where ``stop`` (Ctrl-C, SIGTERM) abandons it at
    once should it hang (:func:`~tasks.stopping.abandonable`), and its errors (``sys.exit``
    included) end this data set only, as a ``Failed`` state whose message is the one line
    that says why (its cells fail with it; no traceback on the console)."""
    what = f"simulate {system} seed {seed}"
    try:
        return abandonable(lambda: simulate_data(system, data, seed).fingerprint, stop, what)
    except Interrupted as e:
        return Cancelled(message=str(e))
    except Exception as e:
        return Failed(message=f"{type(e).__name__}: {e}", data=e)


def simulate_data_sets(
    cells: Iterable[CellConfig], stop: threading.Event | None = None
) -> list[CellResult]:
    """Each data set of ``cells`` simulated once (or read from the cache) by a
    :func:`simulate_task` on the flow's task runner, before any cell trains; the cells whose
    data set could not be made, failed with why in one line (a simulator's error or
    ``sys.exit``, non-finite data), or interrupted (``stop`` set meanwhile): their training
    never runs the simulator again."""
    cells = list(cells)
    keys = {_data_key(c): (c.system, c.data, c.seed) for c in cells}
    futures = {k: simulate_task.submit(*args, stop) for k, args in keys.items()}
    wait(list(futures.values()))
    why: dict[str, tuple[Literal["failed", "interrupted"], str | None]] = {}
    for k, fut in futures.items():
        if not (state := fut.state).is_completed():
            status: Literal["failed", "interrupted"] = (
                "interrupted" if state.is_cancelled() else "failed"
            )
            why[k] = (status, state.message or state.name)
    return [CellResult.failed(c, *why[k]) for c in cells if (k := _data_key(c)) in why]


def _data_key(c: CellConfig) -> str:
    return f"{c.system}|{c.data.model_dump_json()}|{c.seed}"


def pack_label(cells: Sequence[CellConfig]) -> str:
    """``system/method/seed0`` for one cell, ``system/method/seeds 0,1,2`` for a pack of one
    system, ``method: system/seed0, other/seed0`` for a pack across systems, and what sets the
    cells apart from the model's defaults, if anything (``… (stereographic=False)``), so that
    the variants of a study have distinct task names."""
    c = cells[0]
    if len(cells) == 1:
        label = c.key
    elif len({x.system for x in cells}) == 1:
        label = f"{c.system}/{c.method}/seeds " + ",".join(str(x.seed) for x in cells)
    else:
        label = f"{c.method}: " + ", ".join(f"{x.system}/seed{x.seed}" for x in cells)
    variant = cell_variant(c)
    return f"{label} ({variant})" if variant else label


def _task_run_name() -> str:
    from prefect.runtime import task_run

    return pack_label(task_run.parameters["cells"])


@task(name="cells", task_run_name=_task_run_name, cache_policy=NO_CACHE)
def pack_task(cells: list[CellConfig], runtime: CellRuntime) -> list[CellResult] | State:
    """Train, evaluate and track a pack of cells. If any failed, this task run fails, with them."""
    if runtime.stop is not None and runtime.stop.is_set():  # queued when Ctrl-C came
        return _ended([CellResult.failed(c, "interrupted", _NOT_STARTED) for c in cells])
    if worker_pool_active():
        # A thread event cannot cross processes: workers watch the pool's own stop event.
        runtime = replace(runtime, stop=None)
    try:
        results = run_in_worker(run_pack, cells, runtime)
    except WorkerStopped:
        return _ended([CellResult.failed(c, "interrupted", _NOT_STARTED) for c in cells])
    except WorkerDied as e:
        # Its worker died mid-pack (kill -9, SIGTERM): only these cells fail, their runs too.
        runtime.run_log().end_runs_of_process(e.pid, f"WorkerDied: {e}")
        results = [CellResult.failed(c, "failed", f"WorkerDied: {e}") for c in cells]
    if any(r.status == "failed" for r in results):
        raise PackFailed(results)
    return _ended(results)


def _ended(results: list[CellResult]) -> list[CellResult] | State:
    """The pack's results, as a ``Cancelled`` state when it was interrupted (its log line then
    says so, not "Completed"; the engine reads the results from either)."""
    stopped = [r for r in results if r.status == "interrupted"]
    if not stopped:
        return results
    killed = sum(r.error != _NOT_STARTED for r in stopped)
    what = f"interrupted: {plural(killed, 'cell')} KILLED" if killed else _NOT_STARTED
    return Cancelled(message=what, data=results)


class PackFailed(RuntimeError):
    """Cells of a pack ended in error; ``results`` holds every member's result."""

    def __init__(self, results: Sequence[CellResult]) -> None:
        bad = [r for r in results if r.status == "failed"]
        super().__init__("; ".join(f"{r.key}: {r.error}" for r in bad))
        self.results = tuple(results)
