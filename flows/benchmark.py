"""The benchmark flow: every system × method × seed cell, tracked in one MLflow parent run.

Finished cells (a FINISHED child run carrying the cell's config hash) are reused, not retrained;
failed or interrupted ones are run again. Each cell writes its own run as soon as it ends, so a
crash or Ctrl-C loses no finished result.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from prefect import flow, get_run_logger

from flows.reports import CELLS_ARTIFACT, cells_hash, cells_record
from flows.runtime import artifact_key, flow_settings, make_task_runner, publish_table
from nlmodels import native_cpu_kernels
from tasks.cell import CellRuntime
from tasks.config import CellConfig, RunConfig
from tasks.config.mlflow_names import registered_model_name
from tasks.engine import run_cells, stored_results
from tasks.machine import check_models_fit
from tasks.reports import ResultsTable, parent_summary, results_table
from tasks.results import CellResult
from tasks.tracking import Promotion, Registry, RunLog, RunTags, connect, parent_run

__all__ = [
    "BenchmarkSummary",
    "benchmark_flow",
    "champions",
    "experiment_hash",
    "native_kernels_note",
    "registry_name",
    "run_benchmark",
]

#: The method whose best run per system is registered unless the config names others.
REGISTERED_METHOD = "neural_laplace"


def experiment_hash(config: RunConfig) -> str:
    """What makes two benchmarks comparable: the same experiment (how it executed and where it
    is tracked aside)."""
    text = config.model_dump_json(exclude={"execution", "tracking"})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def registry_name(system: str, method: str = REGISTERED_METHOD) -> str:
    """The registered model of ``method``'s champion on ``system`` (``neural-laplace-<system>``,
    ``node-<system>``; any method through :mod:`tasks.config.mlflow_names`)."""
    return registered_model_name(method, system)


@dataclass(frozen=True)
class BenchmarkSummary:
    parent_run_id: str | None  # None only for a configuration without cells
    results: tuple[CellResult, ...]
    table: ResultsTable
    promotions: tuple[Promotion, ...]
    seconds: float

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)


def champions(results: list[CellResult], config: RunConfig) -> dict[tuple[str, str], CellResult]:
    """The candidate champion per ``(method, system)``: the finished cell of lowest test RMSE
    of each method the config registers (``tracking.register_methods``). A model that never
    learned, or one scored on a split too small (:meth:`RunConfig.small_split`), stays in its
    run only."""
    wanted = config.tracking.registered(config.methods)
    usable = {s for s in config.systems if config.small_split(s) is None}
    best: dict[tuple[str, str], CellResult] = {}
    lowest: dict[tuple[str, str], float] = {}  # their test RMSE
    for r in results:
        rmse = r.test_rmse  # (a result that is ok has one)
        if r.method in wanted and r.ok and r.run_id and r.diverged is None and r.system in usable:
            key = (r.method, r.system)
            if rmse is not None and (key not in best or rmse < lowest[key]):
                best[key], lowest[key] = r, rmse
    return best


def _promote(registry: Registry, results: list[CellResult], config: RunConfig) -> list[Promotion]:
    """Register each of :func:`champions`, promoted to @champion only if it beats the last."""
    promotions = []
    for (m, s), r in champions(results, config).items():
        assert r.run_id is not None and r.test_rmse is not None  # as champions picks them
        name = registry_name(s, m)
        promotions.append(
            registry.promote_if_better(name, r.run_id, r.test_rmse, method=m, system=s)
        )
    return promotions


def _parent_params(config: RunConfig, n_cells: int) -> dict[str, object]:
    """The experiment's selection as the parent run's parameters."""
    return {
        "profile": config.profile,
        "systems": ",".join(config.systems),
        "methods": ",".join(config.methods),
        "seeds": ",".join(map(str, config.seeds)),
        "n_cells": n_cells,
    }


def _parent_tags(config: RunConfig, cells: list[CellConfig]) -> dict[str, str]:
    """What the benchmark's parent run is: its profile, experiment and cells (by which
    :mod:`flows.reports.compare` finds the earlier benchmark to compare it with)."""
    return {
        RunTags.PROFILE: config.profile,
        RunTags.EXPERIMENT_HASH: experiment_hash(config),
        RunTags.CELLS_HASH: cells_hash(c.config_hash() for c in cells),
    }


def native_kernels_note(cells: Sequence[CellConfig], device: str, native: bool) -> str | None:
    """Which path float64 Neural Laplace cells on the CPU take (the native C kernels or their
    torch twins), or ``None`` when the run has no such cell (a user's model alone, float32,
    every cell on CUDA)."""
    if device == "cuda" or not any(
        c.method == "neural_laplace" and c.training.dtype == "float64" for c in cells
    ):
        return None
    path = "the native C kernels" if native else "the pure-torch path"
    return f"float64 Neural Laplace on the CPU runs {path}"


@flow(name="nllab-benchmark", log_prints=True)
def benchmark_flow(
    config: RunConfig,
    reused: tuple[CellResult, ...] | None = None,
    stop: threading.Event | None = None,
    on_finished: Callable[[Sequence[CellResult]], None] | None = None,
) -> BenchmarkSummary:
    """Run (or reuse) every cell of ``config`` and log the results table to a parent run.

    ``reused``: the cells :func:`tasks.machine.reuse.stored_results` already found finished in this
    command (the store is not asked again for them). ``stop``
    (:attr:`tasks.cell.CellRuntime.stop`) and ``on_finished``: as :func:`tasks.engine.run_cells`
    takes them."""
    logger = get_run_logger()
    t0 = time.perf_counter()
    # Connect (and create the sqlite store) before any worker thread writes to it.
    tracking = connect(config.tracking)
    cells = config.cells()
    # Also builds the kernels once here, before any worker process needs them.
    native = native_cpu_kernels()
    if kernels_note := native_kernels_note(cells, config.execution.device, native):
        logger.info(kernels_note)
    with parent_run(
        tracking.runs,
        f"benchmark-{config.profile}",
        kind="benchmark",
        tags=_parent_tags(config, cells),
        # The experiment as parameters and run_config.json; how it executed as tags.
        params=_parent_params(config, len(cells)),
        execution=config.execution.model_dump(mode="json"),
        config_json=(config.experiment_json(), "run_config.json"),
    ) as run:
        parent = run.run_id
        runtime = CellRuntime.for_config(
            tracking.store,
            config,
            parent,
            stop=(stop or threading.Event()) if config.execution.task_runner == "thread" else None,
        )
        results = run_cells(cells, runtime, reused=reused, on_finished=on_finished)
        table = _log_table(tracking.runs, parent, config.profile, results)
        promotions = _promote(tracking.registry, results, config)
        description, summary_metrics = parent_summary(
            results, f"Benchmark, profile {config.profile}", config.profile
        )
        tracking.runs.log_metrics(parent, summary_metrics)
        run.record_cells(results, note=description)
        for r in results:
            if not r.ok:
                logger.error(
                    "cell %s/%s/seed%d %s: %s", r.system, r.method, r.seed, r.status, r.error
                )
    return BenchmarkSummary(
        parent, tuple(results), table, tuple(promotions), time.perf_counter() - t0
    )


def _log_table(runs: RunLog, parent: str, profile: str, results: list[CellResult]) -> ResultsTable:
    """The results table (csv, md, tex) and the cells' record on the parent run, the table also
    as a Prefect artifact."""
    table = results_table(results, profile=profile)
    with tempfile.TemporaryDirectory(prefix="nllab-report-") as tmp:
        table.write(Path(tmp))
        runs.log_artifact(parent, Path(tmp), "results")
    runs.log_text(parent, cells_record(results), CELLS_ARTIFACT)
    publish_table(
        artifact_key("benchmark", profile, "results"),
        table.frame.to_dict("records"),
        f"Benchmark {profile}: test RMSE per system and method (MLflow run {parent})",
    )
    return table


def run_benchmark(
    config: RunConfig,
    *,
    always_record: bool = False,
    stop: threading.Event | None = None,
    on_finished: Callable[[Sequence[CellResult]], None] | None = None,
) -> BenchmarkSummary:
    """Call :func:`benchmark_flow` with the configured task runner and flow settings.

    When every cell already has a finished run, nothing is started (no Prefect server, no new,
    empty parent run): the summary is read from the store, under the parent run that trained the
    first cell; ``always_record`` records a new parent run even then (a schedule, whose each
    run is compared with the one before). ``stop`` and ``on_finished``: as
    :func:`benchmark_flow` takes them (the reused cells are not passed to ``on_finished``).
    """
    t0 = time.perf_counter()
    check_models_fit(config.cells(), config.execution.device)  # before MLflow and Prefect
    # Fail on an unusable tracking store before starting Prefect (and create sqlite once).
    tracking = connect(config.tracking)
    reused, todo = stored_results(
        tracking.queries, config.cells(), config.execution.reuse, device=config.execution.device
    )
    if not todo and not always_record:
        promotions = _promote(tracking.registry, reused, config)
        first = reused[0].run_id if reused else None
        parent = (tracking.queries.get_run_data(first).parent_run_id or first) if first else None
        return BenchmarkSummary(
            parent,
            tuple(reused),
            results_table(reused, profile=config.profile),
            tuple(promotions),
            time.perf_counter() - t0,
        )
    with flow_settings():
        flow_ = benchmark_flow.with_options(task_runner=make_task_runner(config))
        return flow_(config, tuple(reused), stop, on_finished)
