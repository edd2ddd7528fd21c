"""``nllab tune``: an Optuna study for one method on one system (handler in :mod:`flows.tune`)."""

from __future__ import annotations

import argparse

from flows.cli._common import add_runner_options, add_training_options, check_names, positive_int

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    from tasks.config import DEVICES, PROFILES

    p = sub.add_parser(
        "tune",
        help="hyperparameter search (Optuna) for one method on one system",
        description="An Optuna study (TPE, seeded; median or Hyperband pruning on validation "
        "RMSE) whose trials are nested MLflow runs. Interrupted studies resume: run the same "
        "command again. The best configuration is used by `nllab benchmark --tuned`.",
    )
    p.add_argument("--method", required=True, help="model to tune, e.g. neural_laplace")
    p.add_argument("--system", required=True, help="system, e.g. lotka_volterra_dde")
    p.add_argument(
        "--trials", type=positive_int, required=True, metavar="N", help="trials in the study"
    )
    p.add_argument("--profile", choices=PROFILES, default="smoke", help="budget of each trial")
    p.add_argument("--config", metavar="FILE", help="TOML, JSON or YAML run config file")
    p.add_argument(
        "--storage",
        metavar="URL",
        help="Optuna storage (default: sqlite under $NLLAB_HOME/optuna), "
        "e.g. postgresql+psycopg2://USER:PASS@HOST/optuna",
    )
    p.add_argument("--study-name", metavar="NAME", help="default: METHOD-SYSTEM-PROFILE")
    p.add_argument("--n-jobs", type=positive_int, default=1, metavar="N", help="parallel trials")
    p.add_argument("--pruner", choices=("median", "hyperband"), default="median")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    add_training_options(p, budget_default="none")
    p.add_argument("--device", choices=DEVICES, default="cpu")
    add_runner_options(p)  # thread unless --task-runner dask or --dask-address
    p.set_defaults(handler=run, precheck=precheck)
    return p


def precheck(args: argparse.Namespace) -> None:
    """The method, system and config file, before the heavy stack loads."""
    check_names(systems=[args.system], methods=[args.method], config_file=args.config)


def run(args: argparse.Namespace) -> int:
    from flows.tune import cmd_tune

    return cmd_tune(args)
