"""Thin Prefect tasks over the plain functions of this package.

Inputs hold live objects (a stop event), so Prefect's input-hash caching is off: a
finished cell is recognised by its config hash in MLflow instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks._workers import WorkerDied, WorkerStopped, run_in_worker, worker_pool_active
from tasks.cell import CellRuntime, run_pack, simulate_data
from tasks.config import CellConfig, DataConfig
from tasks.results import CellResult
from tasks.tracking import cell_variant

__all__ = ["PackFailed", "pack_task", "simulate_task"]

_NOT_STARTED = "interrupted before it started"


@task(name="simulate", task_run_name="simulate {system} seed {seed}", cache_policy=NO_CACHE)
def simulate_task(system: str, data: DataConfig, seed: int) -> str:
    """Simulate (or load from the cache) one data set; returns its fingerprint."""
    return simulate_data(system, data, seed).fingerprint


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
def pack_task(cells: list[CellConfig], runtime: CellRuntime) -> list[CellResult]:
    """Train, evaluate and track a pack of cells. If any failed, this task run fails, with them."""
    if runtime.stop is not None and runtime.stop.is_set():  # queued when Ctrl-C came
        return [CellResult.failed(c, "interrupted", _NOT_STARTED) for c in cells]
    if worker_pool_active():
        # A thread event cannot cross processes: workers watch the pool's own stop event.
        runtime = replace(runtime, stop=None)
    try:
        results = run_in_worker(run_pack, cells, runtime)
    except WorkerStopped:
        return [CellResult.failed(c, "interrupted", _NOT_STARTED) for c in cells]
    except WorkerDied as e:
        # Its worker died mid-pack (kill -9, SIGTERM): only these cells fail, their runs too.
        runtime.run_log().end_runs_of_process(e.pid, f"WorkerDied: {e}")
        results = [CellResult.failed(c, "failed", f"WorkerDied: {e}") for c in cells]
    if any(r.status == "failed" for r in results):
        raise PackFailed(results)
    return results


class PackFailed(RuntimeError):
    """Cells of a pack ended in error; ``results`` holds every member's result."""

    def __init__(self, results: Sequence[CellResult]) -> None:
        bad = [r for r in results if r.status == "failed"]
        super().__init__("; ".join(f"{r.key}: {r.error}" for r in bad))
        self.results = tuple(results)
