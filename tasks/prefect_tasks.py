"""Thin Prefect tasks over the plain functions of this package.

Inputs hold live objects (a tracker, a stop event), so Prefect's input-hash caching is off: a
finished cell is recognised by its config hash in MLflow instead.
"""

from __future__ import annotations

from dataclasses import replace

import tasks._env  # noqa: F401  (offline switches before mlflow/prefect load)

# isort: split
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks._workers import WorkerStopped, run_in_worker, worker_pool_active
from tasks.cell import CellRuntime, run_cell, simulate_data
from tasks.config import CellConfig, DataConfig
from tasks.reporting import CellResult

__all__ = ["cell_task", "simulate_task"]


@task(name="simulate", task_run_name="simulate {system} seed {seed}", cache_policy=NO_CACHE)
def simulate_task(system: str, data: DataConfig, seed: int) -> str:
    """Simulate (or load from the cache) one data set; returns its fingerprint."""
    return simulate_data(system, data, seed).fingerprint


@task(
    name="cell", task_run_name="{cell.system}/{cell.method}/seed{cell.seed}", cache_policy=NO_CACHE
)
def cell_task(cell: CellConfig, runtime: CellRuntime) -> CellResult:
    """Train, evaluate and track one cell. A failed cell fails this task run, with its error."""
    if runtime.stop is not None and runtime.stop.is_set():
        return _not_started(cell)  # queued when Ctrl-C came
    if worker_pool_active():
        # A thread event cannot cross processes: workers watch the pool's own stop event.
        runtime = replace(runtime, stop=None)
    try:
        result = run_in_worker(run_cell, cell, runtime)
    except WorkerStopped:
        return _not_started(cell)
    if result.status == "failed":
        raise CellFailed(result)
    return result


def _not_started(cell: CellConfig) -> CellResult:
    return CellResult(
        cell.system,
        cell.method,
        cell.seed,
        "interrupted",
        config_hash=cell.config_hash(),
        error="interrupted before it started",
    )


class CellFailed(RuntimeError):
    """A cell ended in error; ``result`` holds what the report needs."""

    def __init__(self, result: CellResult) -> None:
        super().__init__(f"{result.system}/{result.method}/seed{result.seed}: {result.error}")
        self.result = result
