"""``nllab tune``: an Optuna study as a Prefect flow (plain functions in :mod:`tasks.tuning`).

With the default thread runner the trials run in this process (``--n-jobs`` Optuna threads).
With ``--task-runner dask`` the study is opened here and ``--n-jobs`` shards of its trials run
as Prefect tasks on the Dask cluster, all sharing the study's RDB storage (use Postgres when the
workers are on other machines).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from optuna.trial import TrialState
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from pydantic import ValidationError

from flows._runtime import flow_settings
from flows.cli._common import task_runner, training_overrides
from flows.cli.tune import add_parser as add_tune_parser  # loads without Prefect
from tasks.search_spaces import search_space
from tasks.tuning import (
    StorageUnavailable,
    TuneResult,
    TuneSpec,
    TuningError,
    open_session,
    open_storage,
    run_trials,
    run_tuning,
    sigterm_interrupts,
)

__all__ = ["add_tune_parser", "cmd_tune", "run_tune", "split_trials", "tune_flow"]


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
    if spec.task_runner == "thread":
        result = run_tuning(spec)
    else:
        session = open_session(spec)
        try:
            # Queued trials (the paper point, retries of stale ones) run here first: claiming a
            # WAITING trial is not atomic on sqlite, so two shards could both take the same one.
            with sigterm_interrupts():
                queued = session.counts()[TrialState.WAITING]
                session.optimize(min(queued, session.remaining()), 1)
                shards = split_trials(session.remaining(), spec.n_jobs)
                logger.info("study %s: %s trials on Dask", spec.study_name, shards)
                wait([trials_task.submit(spec, session.parent_run_id, n) for n in shards])
        except BaseException as e:
            session.end_parent(e)
            raise
        result = session.finish()
    logger.info(
        "study %s: best trial %d, validation RMSE %.6g; %s",
        result.study_name,
        result.best_trial,
        result.best_value,
        result.dashboard,
    )
    return result


def run_tune(spec: TuneSpec) -> TuneResult:
    """Call :func:`tune_flow` with the spec's task runner and the platform's flow settings."""
    runner = None
    if spec.task_runner == "dask":
        from flows._dask import dask_task_runner
        from tasks.tracking import TrackingSettings

        tracking = TrackingSettings.resolve(spec.run_config().tracking)
        runner = dask_task_runner(spec.n_jobs, spec.dask_address, tracking)
    with flow_settings():
        f = tune_flow.with_options(task_runner=runner) if runner is not None else tune_flow
        return f(spec)


# -- command line -------------------------------------------------------------------------------
def spec_from_args(args: argparse.Namespace) -> TuneSpec:
    overrides: dict[str, Any] = {"progress": False}
    if args.pack is not None:
        overrides["pack"] = args.pack
    if training := training_overrides(args):
        overrides["training"] = training
    return TuneSpec(
        method=args.method,
        system=args.system,
        profile=args.profile,
        n_trials=args.trials,
        n_jobs=args.n_jobs,
        storage=args.storage,
        name=args.study_name,
        seed=args.seed,
        pruner=args.pruner,
        config_file=args.config,
        overrides=overrides,
        device=args.device,
        task_runner=task_runner(args) or "thread",
        dask_address=args.dask_address,
    )


def _one_line(err: ValidationError) -> str:
    """A pydantic error of the tuning spec as ``n_trials: must be ... (got 0)`` lines."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'spec'}: "
        f"{e['msg'].removeprefix('Value error, ')} (got {e.get('input')!r})"
        for e in err.errors()
    )


def cmd_tune(args: argparse.Namespace) -> int:
    """Handler of ``nllab tune``: 0 done, 1 no trial completed, 2 bad arguments; an unreachable
    storage raises :class:`~tasks.tuning.StorageUnavailable` (exit 3 in ``nllab``). SIGTERM
    ends the running trial FAIL and the parent run KILLED, as Ctrl-C does."""
    try:
        spec = spec_from_args(args)
        spec.run_config()  # unknown system/method, bad profile: a usage error before any work
        search_space(spec.method)  # a method with no search space: before Prefect starts
        # A malformed URL (exit 2) or an unreachable server (exit 3): before Prefect starts.
        open_storage(spec.storage).engine.dispose()
    except ValidationError as e:
        print(f"nllab tune: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except StorageUnavailable:
        raise
    except (TuningError, ValueError) as e:  # a malformed storage URL; no search space
        print(f"nllab tune: error: {e}", file=sys.stderr)
        return 2
    try:
        with sigterm_interrupts():
            result = run_tune(spec)
    except StorageUnavailable:
        raise
    except TuningError as e:
        print(f"nllab tune: error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # e.g. no search space for the method
        print(f"nllab tune: error: {e}", file=sys.stderr)
        return 2
    b = result.best
    print(
        f"study {result.study_name}: {result.n_complete} complete, {result.n_pruned} pruned, "
        f"{result.n_failed} failed trials"
    )
    first = f" (first trial: {result.first_value:.6g})" if result.first_value is not None else ""
    print(f"best trial {result.best_trial}: validation RMSE {result.best_value:.6g}{first}")
    print(f"  model overrides {b.model}; training overrides {b.training}")
    print(f"MLflow parent run {result.parent_run_id}; use it with: nllab benchmark --tuned")
    print(f"dashboard: {result.dashboard}")
    return 0
