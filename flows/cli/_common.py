"""What every subcommand parser shares: exit codes, name/seed lists, runner options.

Only the standard library and :mod:`tasks.config` (pydantic) load here: parsing, ``--help`` and
usage errors never import torch, mlflow or prefect.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_TRACKING",
    "EXIT_USAGE",
    "Parser",
    "UsageError",
    "add_runner_options",
    "add_selection",
    "check_environment",
    "parse_seeds",
    "positive_int",
    "split_names",
    "task_runner",
]

EXIT_FAILED, EXIT_USAGE, EXIT_TRACKING, EXIT_INTERRUPTED = 1, 2, 3, 130


class UsageError(ValueError):
    """A bad command-line value: exit code 2 with the message."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose description may be computed when help is shown.

    ``parser.describe = callable`` defers a description that needs heavy imports (the study
    list) until ``--help`` asks for it.
    """

    describe: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.describe is not None:
            self.description, self.describe = self.describe(), None
        return super().format_help()


def split_names(values: Sequence[str] | None) -> list[str] | None:
    """``--systems a,b c`` → ``[a, b, c]``."""
    if values is None:
        return None
    return [n for v in values for n in v.split(",") if n]


def parse_seeds(values: Sequence[str] | None) -> list[int] | None:
    """``--seeds 0 1,2`` → ``[0, 1, 2]``; a non-integer is a :class:`UsageError`."""
    names = split_names(values)
    if names is None:
        return None
    from tasks.config import MAX_SEED

    try:
        seeds = [int(n) for n in names]
    except ValueError:
        seeds = []
    if not seeds or any(s > MAX_SEED for s in seeds):  # negatives: the config says so
        raise UsageError(
            f"--seeds takes non-negative integers up to {MAX_SEED}, got {' '.join(values)!r}"
        ) from None
    return seeds


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer of at least 1 (``--trials 0`` is a usage error)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, got {text!r}")
    return value


def task_runner(args: argparse.Namespace) -> str | None:
    """The task runner the arguments ask for: ``--dask-address`` implies ``dask``, and with
    ``--task-runner thread`` it is a :class:`UsageError` (it would be silently ignored)."""
    runner, address = getattr(args, "task_runner", None), getattr(args, "dask_address", None)
    if address and runner == "thread":
        raise UsageError(
            f"--dask-address {address} needs the Dask runner: drop --task-runner thread "
            "(--dask-address implies --task-runner dask)"
        )
    return "dask" if address else runner


def check_environment() -> None:
    """Environment variables that would fail deep inside a run: a :class:`UsageError` now."""
    import os

    from tasks.config import MAX_EXPERIMENT_NAME

    name = os.environ.get("NLLAB_EXPERIMENT", "")
    if len(name) > MAX_EXPERIMENT_NAME:
        raise UsageError(
            f"NLLAB_EXPERIMENT is {len(name)} characters long; MLflow experiment names have at "
            f"most {MAX_EXPERIMENT_NAME}"
        )


def add_runner_options(p: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--task-runner thread|dask``, ``--dask-address`` and ``--pack/--no-pack``, shared by
    every command that trains."""
    p.add_argument(
        "--task-runner",
        choices=("thread", "dask"),
        default=default,
        help="thread pool (default) or Dask (a local cluster unless --dask-address)",
    )
    p.add_argument("--dask-address", metavar="tcp://HOST:PORT", help="an existing Dask scheduler")
    p.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="train cells that differ only in seed as one batched model, each cell's result "
        "exactly as unpacked (default: on)",
    )


def add_selection(
    p: argparse.ArgumentParser,
    *,
    methods: bool = True,
    device: bool = True,
    profile_help: str = "size preset (default: quick)",
) -> None:
    """``--profile --config --systems [--methods] --seeds [--device]``."""
    from tasks.config import DEVICES, PROFILES

    p.add_argument("--profile", choices=PROFILES, help=profile_help)
    p.add_argument("--config", metavar="FILE", help="TOML, JSON or YAML config file")
    p.add_argument("--systems", nargs="+", metavar="NAME", help="systems (default: main table)")
    if methods:
        p.add_argument("--methods", nargs="+", metavar="NAME", help="models (default: all six)")
    p.add_argument("--seeds", nargs="+", metavar="N", help="seeds, e.g. 0 1 2 or 0,1,2")
    if device:
        p.add_argument("--device", choices=DEVICES, help="default: auto")


def add_training_options(p: argparse.ArgumentParser) -> None:
    """``--epochs N --budget SECONDS``: the training budget of every cell."""
    p.add_argument("--epochs", type=int, metavar="N", help="override the profile's epochs")
    p.add_argument(
        "--budget",
        type=_budget,
        metavar="SECONDS",
        help="training seconds each cell gets (quick profile: 25; 'none': no time limit)",
    )


def _budget(text: str) -> float | str:
    if text.strip().lower() == "none":
        return "none"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds or 'none', got {text!r}") from None


def training_overrides(args: argparse.Namespace) -> dict:
    """The ``training`` overrides of :func:`add_training_options` (empty if none given)."""
    o: dict = {}
    if getattr(args, "epochs", None) is not None:
        o["epochs"] = args.epochs
    budget = getattr(args, "budget", None)
    if budget is not None:
        o["max_train_seconds"] = None if budget == "none" else budget
    return o


def overrides(args: argparse.Namespace) -> dict:
    """The run-config overrides named on the command line."""
    o: dict = {
        "systems": split_names(getattr(args, "systems", None)),
        "methods": split_names(getattr(args, "methods", None)),
        "seeds": parse_seeds(getattr(args, "seeds", None)),
        "device": getattr(args, "device", None),
        "max_workers": getattr(args, "max_workers", None),
        "task_runner": task_runner(args),
        "dask_address": getattr(args, "dask_address", None),
        "pack": getattr(args, "pack", None),
    }
    if training := training_overrides(args):
        o["training"] = training
    if getattr(args, "no_progress", False):
        o["progress"] = False
    if getattr(args, "no_register", False):
        o["tracking"] = {"register_models": False}
    return o


def resolve(args: argparse.Namespace, profile: str | None = None):
    """The :class:`~tasks.config.RunConfig` of the arguments; CUDA asked but absent → usage."""
    from tasks.config import resolve_config

    config = resolve_config(profile or args.profile, args.config, overrides(args))
    if address := config.execution.dask_address:
        # Seconds, before the stack loads: not Dask's retries, with tracebacks, a minute later.
        from flows.cli._faults import EnvironmentFault, connect_error

        if isinstance(error := connect_error(address, 5.0), ValueError):
            raise UsageError(f"--dask-address takes tcp://HOST:PORT, got {address!r}")
        if error is not None:
            raise EnvironmentFault(
                f"no Dask scheduler answers at {address} "
                f"({getattr(error, 'strerror', None) or error}): start it "
                "(`dask scheduler --port PORT`) or correct --dask-address"
            )
    if config.execution.device == "cuda":
        from tasks.training import select_device

        try:
            select_device("cuda")
        except RuntimeError as e:
            raise UsageError(str(e)) from None
    return config
