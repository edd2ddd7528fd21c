"""``nllab tune``: an Optuna study for one method on one system (the flow: :mod:`flows.tune`)."""

from __future__ import annotations

import argparse
from typing import Any

from flows.cli import common as cli

__all__ = ["add_parser", "run", "spec_from_args"]


def add_parser(sub) -> argparse.ArgumentParser:
    from tasks.config import DEVICES, PROFILES

    p = sub.add_parser(
        "tune",
        help="hyperparameter search (Optuna) for one method on one system",
        description="An Optuna study (TPE, seeded; median or Hyperband pruning on validation "
        "RMSE) whose trials are nested MLflow runs. Interrupted studies resume: run the same "
        "command again. The best configuration is used by `nllab benchmark --tuned` at the "
        "same profile (the command prints the exact benchmark line).",
    )
    p.add_argument("--method", required=True, help="model to tune, e.g. neural_laplace")
    p.add_argument("--system", required=True, help="system, e.g. lotka_volterra_dde")
    p.add_argument(
        "--trials", type=cli.positive_int, required=True, metavar="N", help="trials in the study"
    )
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default="smoke",
        help="budget of each trial (default: smoke); `benchmark --tuned` reads the study at this "
        "profile",
    )
    p.add_argument("--config", metavar="FILE", help="TOML, JSON or YAML run config file")
    p.add_argument(
        "--storage",
        metavar="URL",
        help="Optuna storage (default: sqlite under $NLLAB_HOME/optuna), "
        "e.g. postgresql+psycopg2://USER:PASS@HOST/optuna",
    )
    p.add_argument("--study-name", metavar="NAME", help="default: METHOD-SYSTEM-PROFILE")
    p.add_argument(
        "--n-jobs", type=cli.positive_int, default=1, metavar="N", help="parallel trials"
    )
    p.add_argument("--pruner", choices=("median", "hyperband"), default="median")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    cli.add_training_options(p, budget_default="none")
    p.add_argument("--device", choices=DEVICES, default="cpu")
    cli.add_runner_options(p)  # thread unless --task-runner dask or --dask-address
    p.set_defaults(handler=run, precheck=precheck, computes=True)
    return p


def precheck(args: argparse.Namespace) -> None:
    """The method, system and config file, before the heavy stack loads."""
    cli.check_names(systems=[args.system], methods=[args.method], config_file=args.config)
    cli.check_storage(args.storage)


def spec_from_args(args: argparse.Namespace):
    """The :class:`~tasks.tuning.TuneSpec` of the parsed arguments (pydantic validates it)."""
    from tasks.tuning import TuneSpec

    overrides: dict[str, Any] = {"progress": False, **cli.runner_overrides(args)}
    if training := cli.training_overrides(args):
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
        task_runner=cli.task_runner(args) or "thread",
        dask_address=args.dask_address,
    )


def _one_line(err) -> str:
    """A pydantic error of the tuning spec as ``n_trials: must be ... (got 0)`` lines."""
    from tasks.config import validation_problems

    return "; ".join(validation_problems(err, show_input=True))


def run(args: argparse.Namespace) -> int:
    """Handler of ``nllab tune``: 0 done, 1 no trial completed, 2 bad arguments; an unreachable
    storage raises :class:`~tasks.tuning.StorageUnavailable` (exit 3 in ``nllab``). SIGTERM
    ends the running trial FAIL and the parent run KILLED, as Ctrl-C does."""
    from pydantic import ValidationError

    from flows.tune import run_tune
    from tasks.reports import number
    from tasks.tuning import StorageUnavailable, TuningError, open_storage, sigterm_interrupts
    from tasks.tuning.search_spaces import search_space

    # A tracking server that is down: exit 3 before Prefect starts or a study is created.
    cli.check_tracking_server()
    try:
        spec = spec_from_args(args)
        spec.run_config()  # unknown system/method, bad profile: a usage error before any work
        search_space(spec.method)  # a method with no search space: before Prefect starts
        # A malformed URL (exit 2) or an unreachable server (exit 3): before Prefect starts.
        open_storage(spec.storage).engine.dispose()
    except ValidationError as e:
        raise cli.UsageError(_one_line(e)) from None
    except StorageUnavailable:
        raise
    except (TuningError, ValueError) as e:  # a malformed storage URL; no search space
        raise cli.UsageError(str(e)) from None
    try:
        with sigterm_interrupts():
            result = run_tune(spec)
    except StorageUnavailable:
        raise
    except TuningError as e:
        raise cli.CommandFailed(str(e)) from None
    except ValueError as e:  # e.g. no search space for the method
        raise cli.UsageError(str(e)) from None
    b = result.best
    print(
        f"study {result.study_name}: {result.n_complete} complete, {result.n_pruned} pruned, "
        f"{result.n_failed} failed trials"
    )
    first = (
        f" (first trial: {number(result.first_value)})" if result.first_value is not None else ""
    )
    print(f"best trial {result.best_trial}: validation RMSE {number(result.best_value)}{first}")
    print(f"  model overrides {b.model}; training overrides {b.training}")
    print(f"MLflow parent run {result.parent_run_id}")
    print(benchmark_hint(args, result.study_name))
    print(f"dashboard: {result.dashboard}")
    return 0


def benchmark_hint(args: argparse.Namespace, name: str) -> str:
    """The ``nllab benchmark --tuned`` line that trains the tuned cell: the study's profile,
    system, method, storage, config file and training flags, so that it finds this study.

    ``benchmark --tuned`` looks studies up by their default name (METHOD-SYSTEM-PROFILE); a
    study named otherwise cannot be found, and the line says so instead.
    """
    import shlex

    from tasks.tuning import study_name
    from tasks.tuning.storage import redact

    default = study_name(args.method, args.system, args.profile)
    if name != default:
        return (
            f"`nllab benchmark --tuned` reads studies named METHOD-SYSTEM-PROFILE ({default}); "
            f"this one is named {name}: run it again without --study-name to use it there"
        )
    words = ["nllab", "benchmark", "--tuned", "--profile", args.profile]
    words += ["--systems", args.system, "--methods", args.method]
    if args.storage:
        words += ["--storage", redact(args.storage)]
    if args.config:
        words += ["--config", args.config]
    if args.epochs is not None:
        words += ["--epochs", str(args.epochs)]
    if args.budget is not None:
        words += ["--budget", str(args.budget)]
    return f"use it with: {shlex.join(words)}"
