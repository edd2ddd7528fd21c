"""``nllab serve [--config FILE]``: Prefect deployments of the benchmark and of studies on cron.

The schedules come from a TOML file (default: ``flows/serve/schedules.toml``: the smoke benchmark
nightly, chosen studies weekly), read and validated by :mod:`flows.serve._schedules`; a malformed
entry is a :class:`ScheduleError` naming it.

Schedules need a Prefect server (:mod:`flows.runtime.prefect_server`); several ``nllab serve``
instances may serve one server (:mod:`flows.serve.serve_loop`). The command itself is
:mod:`flows.cli.serve`.
"""

from __future__ import annotations

from typing import Any

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from prefect import Flow, flow

from flows.serve._schedules import (
    DEFAULT_SCHEDULES,
    BenchmarkEntry,
    ScheduleError,
    StudyEntry,
    TuneEntry,
    load_schedules,
)

__all__ = [
    "DEFAULT_SCHEDULES",
    "BenchmarkEntry",
    "ScheduleError",
    "StudyEntry",
    "TuneEntry",
    "build_deployments",
    "load_schedules",
    "scheduled_benchmark",
    "scheduled_study",
    "scheduled_tune",
]


# -- deployable flows (resolved at run time, so each run reads the current settings) ----------
@flow(name="nllab-scheduled-benchmark", log_prints=True)
def scheduled_benchmark(profile: str = "smoke", config: dict[str, Any] | None = None) -> str:
    """The benchmark at ``profile`` with run-config overrides ``config``, then its comparison
    with the previous run of the same experiment (:func:`flows.reports.compare.record_comparison`:
    on the parent run and as Prefect artifacts); returns a summary."""
    from flows.benchmark import run_benchmark
    from flows.reports import record_comparison
    from tasks.config import resolve_config
    from tasks.tracking import connect

    run_config = resolve_config(profile, overrides={"progress": False, **(config or {})})
    # a new parent run every night, even when every cell is reused: each night is compared
    summary = run_benchmark(run_config, always_record=True)
    assert summary.parent_run_id is not None  # always_record: the benchmark made its parent run
    comparison = record_comparison(connect(run_config.tracking), summary.parent_run_id)
    regressed = comparison.regressions if comparison is not None else 0
    return f"{len(summary.results)} cells, {summary.count('failed')} failed, {regressed} regressed"


@flow(name="nllab-scheduled-tune", log_prints=True)
def scheduled_tune(study: dict[str, Any]) -> str:
    """One study (``TuneSpec`` fields); resumes the stored study and adds trials up to its size."""
    from flows.tune import run_tune
    from tasks.tuning import TuneSpec

    result = run_tune(TuneSpec.model_validate(study))
    return f"{result.study_name}: best {result.best_value:.6g} (trial {result.best_trial})"


@flow(name="nllab-scheduled-study", log_prints=True)
def scheduled_study(study: str, profile: str = "quick", systems: list[str] | None = None) -> str:
    """One of the paper's studies (``nllab study``) at ``profile``; finished cells are reused."""
    from flows.studies import run_study, study_config

    summary = run_study(study_config(study, profile, systems=systems))
    failed = sum(not c.ok for c in summary.cells)
    return f"study {study}: {len(summary.cells)} cells, {failed} failed"


def build_deployments(entries: list[BenchmarkEntry | TuneEntry | StudyEntry]) -> list:
    """Prefect ``RunnerDeployment`` objects with the entries' cron schedules (nothing served)."""
    flows: dict[str, Flow[..., str]] = {
        "benchmark": scheduled_benchmark,
        "tune": scheduled_tune,
        "study": scheduled_study,
    }
    return [
        flows[e.flow].to_deployment(
            name=e.name,
            schedules=[e.schedule()],
            paused=e.paused,
            parameters=e.parameters(),
            description=e.description or f"nllab {e.flow} on '{e.cron}' ({e.timezone})",
            tags=["nllab", e.flow],
        )
        for e in entries
    ]
