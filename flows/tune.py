"""``nllab tune``: an Optuna study as a Prefect flow (plain functions in :mod:`tasks.tuning`).

With the default thread runner the trials run in this process (``--n-jobs`` Optuna threads).
With ``--task-runner dask`` the study is opened here and ``--n-jobs`` shards of its trials run
as Prefect tasks on the Dask cluster, all sharing the study's RDB storage (use Postgres when the
workers are on other machines).
"""

from __future__ import annotations

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from optuna.trial import TrialState
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait

from flows.runtime import flow_settings
from tasks.tuning import TuneResult, TuneSession, TuneSpec, run_trials, run_tuning

__all__ = ["run_tune", "split_trials", "tune_flow"]


def split_trials(n_trials: int, shards: int) -> list[int]:
    """``n_trials`` spread over at most ``shards`` shards, none empty: 5, 2 → [3, 2]."""
    base, extra = divmod(n_trials, shards)
    return [n for n in (base + (i < extra) for i in range(shards)) if n > 0]


@task(name="tune-trials", task_run_name="trials x{n_trials}", cache_policy=NO_CACHE)
def trials_task(spec: TuneSpec, parent_run_id: str, n_trials: int) -> int:
    return run_trials(spec, parent_run_id, n_trials)


@flow(name="nllab-tune", log_prints=True)
def tune_flow(spec: TuneSpec) -> TuneResult:
    """Run (or resume) the study of ``spec`` until it holds ``spec.n_trials`` trials."""
    logger = get_run_logger()

    def on_dask(session: TuneSession) -> None:
        # Queued trials (the paper point, retries of stale ones) run here first: claiming a
        # WAITING trial is not atomic on sqlite, so two shards could both take the same one.
        queued = session.counts()[TrialState.WAITING]
        session.optimize(min(queued, session.remaining()), 1)
        shards = split_trials(session.remaining(), spec.n_jobs)
        logger.info("study %s: %s trials on Dask", spec.study_name, shards)
        assert session.parent_run_id is not None  # run_tuning calls this in the parent run
        wait([trials_task.submit(spec, session.parent_run_id, n) for n in shards])

    result = run_tuning(spec) if spec.task_runner == "thread" else run_tuning(spec, on_dask)
    # The dashboard line is the command's to print (once), not the flow log's.
    logger.info(
        "study %s: best trial %d, validation RMSE %.4g",
        result.study_name,
        result.best_trial,
        result.best_value,
    )
    return result


def run_tune(spec: TuneSpec) -> TuneResult:
    """Call :func:`tune_flow` with the spec's task runner and the platform's flow settings."""
    runner = None
    if spec.task_runner == "dask":
        from flows.runtime import dask_task_runner
        from tasks.tracking import TrackingSettings

        tracking = TrackingSettings.resolve(spec.run_config().tracking)
        runner = dask_task_runner(min(spec.n_jobs, spec.n_trials), spec.dask_address, tracking)
    with flow_settings():
        f = tune_flow.with_options(task_runner=runner) if runner is not None else tune_flow
        return f(spec)
