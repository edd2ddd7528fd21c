"""The benchmark flow: every system × method × seed cell, tracked in one MLflow parent run.

Finished cells (a FINISHED child run carrying the cell's config hash) are reused, not retrained;
failed or interrupted ones are run again. Each cell writes its own run as soon as it ends, so a
crash or Ctrl-C loses no finished result.
"""

from __future__ import annotations

import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import tasks._env  # noqa: F401  (offline switches before mlflow/prefect load)

# isort: split
from prefect import flow, get_run_logger
from prefect.futures import PrefectFuture, wait

from flows._runtime import flow_settings, make_task_runner
from nlmodels import native_cpu_kernels
from tasks._workers import worker_processes
from tasks.cell import CellRuntime
from tasks.config import CellConfig, RunConfig
from tasks.prefect_tasks import CellFailed, cell_task, simulate_task
from tasks.reporting import CellResult, ResultsTable, results_table
from tasks.tracking import Promotion, Tracker

__all__ = [
    "BenchmarkSummary",
    "benchmark_flow",
    "collect_results",
    "registry_name",
    "run_benchmark",
    "stored_results",
]

#: The method whose best run per system is kept in the model registry.
REGISTERED_METHOD = "neural_laplace"


def registry_name(system: str) -> str:
    return f"neural-laplace-{system}"


@dataclass(frozen=True)
class BenchmarkSummary:
    parent_run_id: str
    results: tuple[CellResult, ...]
    table: ResultsTable
    promotions: tuple[Promotion, ...]
    seconds: float

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)


def collect_results(
    futures: dict[str, PrefectFuture], fallback: dict[str, CellResult]
) -> list[CellResult]:
    """The result of every cell future; a crashed or cancelled one gets its ``fallback`` record."""
    out = []
    for key, fut in futures.items():
        state = fut.state
        value = state.result(raise_on_failure=False) if state.is_final() else None
        if isinstance(value, CellResult):
            out.append(value)
        elif isinstance(value, CellFailed):
            out.append(value.result)
        else:
            # The task itself broke (e.g. the tracking store went away mid-cell).
            r = fallback[key]
            out.append(
                CellResult(
                    r.system,
                    r.method,
                    r.seed,
                    "failed",
                    config_hash=r.config_hash,
                    error=str(value),
                )
            )
    return out


def _promote(tracker: Tracker, results: list[CellResult]) -> list[Promotion]:
    best: dict[str, CellResult] = {}
    for r in results:
        if r.method == REGISTERED_METHOD and r.ok and r.run_id:
            if r.system not in best or r.test_rmse < best[r.system].test_rmse:
                best[r.system] = r
    return [
        tracker.promote_if_better(registry_name(s), r.run_id, r.test_rmse) for s, r in best.items()
    ]


def stored_results(
    tracker: Tracker, cells: list[CellConfig]
) -> tuple[list[CellResult], list[CellConfig]]:
    """Split cells into those with a finished run in the store (as results) and those to run."""
    done = tracker.finished_cells(c.config_hash() for c in cells)
    reused, todo = [], []
    for c in cells:
        rec = done.get(c.config_hash())
        if rec is None:
            todo.append(c)
        else:
            reused.append(
                CellResult(
                    c.system, c.method, c.seed, "reused", rec.test_rmse, rec.run_id, rec.config_hash
                )
            )
    return reused, todo


@flow(name="nllab-benchmark", log_prints=True)
def benchmark_flow(config: RunConfig) -> BenchmarkSummary:
    """Run (or reuse) every cell of ``config`` and log the results table to a parent run."""
    logger = get_run_logger()
    t0 = time.perf_counter()
    # Connect (and create the sqlite store) before any worker thread writes to it.
    tracker = Tracker.connect(config.tracking)
    cells = config.cells()
    hashes = {c.key: c.config_hash() for c in cells}
    reused, todo = stored_results(tracker, cells)
    logger.info(
        "%d cells: %d already finished (reused), %d to run, %d at a time; tracking at %s",
        len(cells),
        len(reused),
        len(todo),
        config.max_workers,
        tracker.settings.tracking_uri,
    )
    # Also builds the kernels once here, before any worker process needs them.
    logger.info(
        "float64 Neural Laplace on the CPU runs %s",
        "the native C kernels" if native_cpu_kernels() else "the pure-torch path",
    )
    stop = threading.Event()
    tags = {"nllab.kind": "benchmark", "profile": config.profile}
    with tracker.run(f"benchmark-{config.profile}", tags) as parent:
        tracker.log_params(
            parent,
            {
                "profile": config.profile,
                "systems": ",".join(config.systems),
                "methods": ",".join(config.methods),
                "seeds": ",".join(map(str, config.seeds)),
                "device": config.device,
                "max_workers": config.max_workers,
                "n_cells": len(cells),
            },
        )
        tracker.log_text(parent, config.model_dump_json(indent=2), "run_config.json")
        runtime = CellRuntime.for_tracker(
            tracker,
            parent_run_id=parent,
            profile=config.profile,
            device=config.device,
            progress=config.progress,
            stop=stop if config.task_runner == "thread" else None,
            torch_threads=config.torch_threads,
        )
        try:
            # One simulation per data set before training, so cells never wait on each other.
            data_keys = sorted({(c.system, c.seed) for c in todo})
            wait([simulate_task.submit(s, config.data, seed) for s, seed in data_keys])
            isolated = config.isolation == "process" and config.task_runner == "thread" and todo
            pool = worker_processes(config.max_workers) if isolated else nullcontext()
            with pool:
                try:
                    futures = {c.key: cell_task.submit(c, runtime) for c in todo}
                    wait(list(futures.values()))
                except BaseException:
                    stop.set()  # before the pool shuts down: queued cells must not start
                    raise
        except BaseException:
            # Ctrl-C: running cells stop at their next batch and end KILLED; finished ones stay.
            stop.set()
            raise
        pending = {
            c.key: CellResult(c.system, c.method, c.seed, "failed", config_hash=hashes[c.key])
            for c in todo
        }
        new = collect_results(futures, pending)
        order = {key: i for i, key in enumerate(hashes)}
        results = sorted(reused + new, key=lambda r: order[r.key])
        table = results_table(results)
        with tempfile.TemporaryDirectory(prefix="nllab-report-") as tmp:
            table.write(Path(tmp))
            tracker.log_artifact(parent, Path(tmp), "results")
        promotions = _promote(tracker, results) if config.tracking.register_models else []
        failed = [r for r in results if not r.ok]
        tracker.set_tags(
            parent,
            {
                "cells_finished": sum(r.status == "finished" for r in results),
                "cells_reused": len(reused),
                "cells_failed": len(failed),
            },
        )
        for r in failed:
            logger.error("cell %s/%s/seed%d %s: %s", r.system, r.method, r.seed, r.status, r.error)
    return BenchmarkSummary(
        parent, tuple(results), table, tuple(promotions), time.perf_counter() - t0
    )


def run_benchmark(config: RunConfig) -> BenchmarkSummary:
    """Call :func:`benchmark_flow` with the configured task runner and flow settings."""
    # Fail on an unusable tracking store before starting Prefect (and create sqlite once).
    Tracker.connect(config.tracking)
    with flow_settings():
        return benchmark_flow.with_options(task_runner=make_task_runner(config))(config)
