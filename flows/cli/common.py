"""What every subcommand parser shares: exit codes, name/seed lists, runner options.

Only the standard library and :mod:`tasks.config` (pydantic) load here: parsing, ``--help`` and
usage errors never import torch, mlflow or prefect.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from flows.cli.values import budget_seconds, names, niceness, port, positive_int, whole_number

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_TRACKING",
    "EXIT_USAGE",
    "CommandFailed",
    "Parser",
    "UsageError",
    "add_runner_options",
    "add_selection",
    "check_device",
    "check_environment",
    "check_names",
    "check_registry_uri",
    "check_storage",
    "check_store_paths",
    "check_tracking_server",
    "cuda_missing",
    "niceness",
    "parse_seeds",
    "port",
    "positive_int",
    "runner_overrides",
    "split_names",
    "task_runner",
    "whole_number",
]

EXIT_FAILED, EXIT_USAGE, EXIT_TRACKING, EXIT_INTERRUPTED = 1, 2, 3, 130


class UsageError(ValueError):
    """A bad command-line value: exit code 2 with the message."""


class CommandFailed(RuntimeError):
    """The command ran and did not succeed (a mismatch, no completed trial): exit code 1 with
    the message."""


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


def check_writable(option: str, value: str, what: str, *, folder: bool = False) -> None:
    """``value`` names a file (``folder``: a folder) that can be written or made with the
    folders above it, checked before the work whose result goes there: a
    :class:`UsageError` naming ``option`` if it, or a folder above it, is of the wrong kind,
    or if the nearest folder that exists is not writable. ``what`` says what the option names."""
    path = Path(value)
    kind = "folder" if folder else "file"
    if path.exists():
        if path.is_dir() != folder:
            other = "a file" if folder else "a folder"
            raise UsageError(f"{option} {value!r} is {other}; {option} names {what}")
        if not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
            raise UsageError(f"{option} {value!r} is not writable; name another {kind}")
        return
    for above in path.absolute().parents:
        if not above.exists():
            continue
        if not above.is_dir():
            raise UsageError(
                f"{option} {value!r} is below {str(above)!r}, a file; {option} names {what}"
            )
        if not os.access(above, os.W_OK | os.X_OK):
            raise UsageError(
                f"{option} {value!r}: {str(above)!r} is not writable; name another {kind}"
            )
        return


def split_names(values: Sequence[str] | None) -> list[str] | None:
    """``--systems a,b c`` → ``[a, b, c]``."""
    if values is None:
        return None
    return [n for v in values for n in v.split(",") if n]


def parse_seeds(values: Sequence[str] | None) -> list[int] | None:
    """``--seeds 0 1,2`` → ``[0, 1, 2]``; a non-integer is a :class:`UsageError`."""
    names = split_names(values)
    if values is None or names is None:
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


def check_storage(url: str | None) -> None:
    """An ``--storage`` URL that would lose the study or need a folder made: a
    :class:`UsageError` before Optuna loads."""
    from tasks.tuning.storage_urls import sqlite_storage_problem

    if url and (problem := sqlite_storage_problem(url)) is not None:
        raise UsageError(problem)


def check_store_paths(home: Path) -> None:
    """Stores sqlite cannot open for their path's length (a deep ``NLLAB_HOME``): a
    :class:`UsageError` at once, not a "cannot open" minutes later."""
    from tasks.tracking.locations import store_path, tracking_uri
    from tasks.tracking.sqlite_faults import path_too_long

    paths = [Path(os.environ.get("PREFECT_HOME", home / "prefect")) / "prefect.db"]
    if (store := store_path(tracking_uri())) is not None:
        paths.append(store)
    for path in paths:
        if (problem := path_too_long(path)) is not None:
            raise UsageError(problem)


def check_tracking_server(timeout: float = 5.0) -> None:
    """A tracking server (``MLFLOW_TRACKING_URI`` http/https) that accepts no connection: an
    :class:`~flows.runtime.faults.EnvironmentFault` (exit 3) in seconds, before Prefect or a study
    starts (MLflow's own retries take minutes)."""
    from urllib.parse import urlsplit

    from flows.runtime import EnvironmentFault, connect_error

    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri.startswith(("http://", "https://")):
        return
    parts = urlsplit(uri)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if (error := connect_error(f"tcp://{parts.hostname}:{port}", timeout)) is not None:
        raise EnvironmentFault(
            f"the MLflow tracking server {uri} does not answer "
            f"({getattr(error, 'strerror', None) or error}); start it, or unset "
            "MLFLOW_TRACKING_URI to use the embedded store"
        )


def check_environment() -> None:
    """Environment variables that would fail deep inside a run: a :class:`UsageError` now."""
    import os

    from tasks.config.run_settings import MAX_EXPERIMENT_NAME

    name = os.environ.get("NLLAB_EXPERIMENT", "")
    if len(name) > MAX_EXPERIMENT_NAME:
        raise UsageError(
            f"NLLAB_EXPERIMENT is {len(name)} characters long; MLflow experiment names have at "
            f"most {MAX_EXPERIMENT_NAME}"
        )


class _ArgumentAdder(Protocol):  # a parser, an argument group, or something that wraps one
    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...


def add_runner_options(
    p: _ArgumentAdder, default: str | None = None, *, checkpoints: bool = True
) -> None:
    """``--task-runner thread|dask``, ``--dask-address``, ``--pack/--no-pack``, ``--reuse`` and
    (``checkpoints``) ``--checkpoints DIR``, shared by every command that trains; read back by
    :func:`runner_overrides`."""
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
        help="train cells of one model and training config whose data have the same shapes "
        "(seeds of a system, systems of equal sizes) as one batched model, each cell's result "
        "as unpacked (default: on)",
    )
    p.add_argument(
        "--reuse",
        choices=("numerics", "config", "never"),
        help="finished cells reused: of the same config hash and today's numerics fingerprints "
        "(numerics, default), of the same config hash whatever code trained them (config), "
        "none (never)",
    )
    if checkpoints:
        p.add_argument(
            "--checkpoints",
            metavar="DIR",
            help="keep each training cell's checkpoint in DIR between epochs, so that a cell "
            "stopped (Ctrl-C, a lost machine) resumes there on the next run, to the bytes of a "
            "run never stopped (default: none; a config file's `checkpoints`)",
        )


def runner_overrides(args: argparse.Namespace) -> dict:
    """The execution overrides of :func:`add_runner_options` that were given (``--pack``,
    ``--reuse``, ``--checkpoints``), after checking that ``--checkpoints`` names a folder that
    can be written."""
    o = {
        k: v for k in ("pack", "reuse", "checkpoints") if (v := getattr(args, k, None)) is not None
    }
    if "checkpoints" in o:
        check_writable("--checkpoints", o["checkpoints"], "the checkpoints' folder", folder=True)
    return o


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
    p.add_argument(
        "--systems", nargs="+", type=names, metavar="NAME", help="systems (default: main table)"
    )
    if methods:
        p.add_argument(
            "--methods", nargs="+", type=names, metavar="NAME", help="models (default: all six)"
        )
    p.add_argument("--seeds", nargs="+", type=names, metavar="N", help="seeds, e.g. 0 1 2 or 0,1,2")
    if device:
        p.add_argument("--device", choices=DEVICES, help="default: auto")


def add_training_options(
    p: argparse.ArgumentParser,
    budget_default: str = "none; the quick profile trains each model its fixed epochs",
) -> None:
    """``--epochs N --budget SECONDS``: the training budget of every cell; ``budget_default``
    says what the command does without ``--budget``."""
    p.add_argument("--epochs", type=int, metavar="N", help="override the profile's epochs")
    p.add_argument(
        "--budget",
        type=budget_seconds,
        metavar="SECONDS",
        help="training seconds each cell gets at most (default: "
        f"{budget_default}; 'none': no time limit)",
    )


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
        **runner_overrides(args),
    }
    if training := training_overrides(args):
        o["training"] = training
    if getattr(args, "no_progress", False):
        o["progress"] = False
    register = split_names(getattr(args, "register", None))
    if getattr(args, "no_register", False):
        o["tracking"] = {"register_models": False}
    elif register:
        o["tracking"] = {"register_methods": register[0] if len(register) == 1 else register}
    return o


def resolve(args: argparse.Namespace, profile: str | None = None):
    """The :class:`~tasks.config.RunConfig` of the arguments; CUDA asked but absent → usage."""
    from tasks.config import resolve_config

    config = resolve_config(profile or args.profile, args.config, overrides(args))
    if address := config.execution.dask_address:
        # Seconds, before the stack loads: not Dask's retries, with tracebacks, a minute later.
        from flows.runtime import EnvironmentFault, connect_error

        if isinstance(error := connect_error(address, 5.0), ValueError):
            raise UsageError(f"--dask-address takes tcp://HOST:PORT, got {address!r}")
        if error is not None:
            raise EnvironmentFault(
                f"no Dask scheduler answers at {address} "
                f"({getattr(error, 'strerror', None) or error}): start it "
                "(`dask scheduler --port PORT`) or correct --dask-address"
            )
    if config.execution.device == "cuda" and (reason := cuda_missing()) is not None:
        raise UsageError(reason)
    return config


def check_device(args: argparse.Namespace) -> None:
    """``--device cuda`` where there is no CUDA: :class:`UsageError` at once (exit 2), before
    Prefect or the data load, and before torch when its build has no CUDA at all."""
    if getattr(args, "device", None) == "cuda" and (reason := cuda_missing()) is not None:
        raise UsageError(reason)


def cuda_missing() -> str | None:
    """Why torch cannot compute on CUDA here (None: it can): read from the files of a CPU
    build of torch without importing it, else asked of torch itself."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    spec = find_spec("torch")
    folders = [Path(f) / "lib" for f in (spec.submodule_search_locations or ())] if spec else []
    gpu = ("libtorch_cuda*.so", "libtorch_hip*.so")  # what CUDA and ROCm builds load
    if folders and not any(next(f.glob(g), None) for f in folders for g in gpu):
        try:
            build = f"torch {version('torch')}"
        except PackageNotFoundError:
            build = "this torch"
        return (
            f"device 'cuda' was requested but CUDA is not available ({build} is a CPU build); "
            "use --device cpu or --device auto, or install a CUDA build of torch"
        )
    from nltrain import select_device

    try:
        select_device("cuda")
    except RuntimeError as e:
        return str(e)
    return None


# -- checks before the heavy stack ------------------------------------------------------------
# Names, files and registry URIs are checked with the standard library and pydantic only, so a
# misspelt name answers in a fraction of a second; the full validation (model settings, value
# ranges, memory) follows in :func:`resolve`, still before MLflow or Prefect load.


def _invalid(where: str, message: str):
    from tasks.config import ConfigError

    return ConfigError(f"invalid configuration: {where}: {message}")


def _check(kind: str, where: str, names: Sequence[str] | None, valid: Sequence[str]) -> None:
    """Each of ``names`` is in ``valid`` (methods: or spelled module:Class, checked when the
    config is resolved), else a config error naming the valid ones; a plugin name two packages
    claim (or a built-in's) says so (:mod:`tasks.config.plugins`)."""
    if names is None:
        return
    from tasks.config import METHODS, SYSTEM_NAMES
    from tasks.config.plugins import MODEL_GROUP, SYSTEM_GROUP, plugin_table

    if kind == "method":
        table = plugin_table(MODEL_GROUP, METHODS)
        names = [n for n in names if ":" not in n]
    else:
        table = plugin_table(SYSTEM_GROUP, SYSTEM_NAMES)
    for name in names:
        if name not in valid and (problem := table.problem(name)) is not None:
            raise _invalid(where, problem)
    unknown = [n for n in names if n not in valid]
    if unknown:
        from tasks.config.checks import unknown_names

        raise _invalid(where, unknown_names(kind, unknown, valid))


def check_names(
    *,
    systems: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    config_file: str | None = None,
    register: Sequence[str] | None = None,
) -> None:
    """Check system and method names, and the config file's (that it exists and parses, and
    the names and profile it holds), without importing numpy, torch, MLflow or Prefect.
    Raises :class:`~tasks.config.ConfigError` (exit code 2) naming the valid choices."""
    from tasks.config import BUILTIN_METHODS, PROFILES, SYSTEM_NAMES, load_config_file
    from tasks.config.declarations import declared_names
    from tasks.config.names import plugin_systems
    from tasks.config.plugins import MODEL_GROUP, plugin_table

    plugin_models = plugin_table(MODEL_GROUP, BUILTIN_METHODS).usable
    valid_methods = tuple(sorted(BUILTIN_METHODS)) + tuple(sorted(plugin_models))
    layer = load_config_file(config_file) if config_file is not None else {}
    valid_systems = SYSTEM_NAMES + declared_names(layer) + tuple(sorted(plugin_systems()))
    _check("system", "systems", systems, valid_systems)
    _check("method", "methods", methods, valid_methods)
    _check("method", "register", register, valid_methods)
    if config_file is None:
        return
    if "profile" in layer and layer["profile"] not in PROFILES:
        profile = layer["profile"]
        raise _invalid("profile", f"unknown profile {profile!r}; valid: {', '.join(PROFILES)}")
    for key, valid in (("systems", valid_systems), ("methods", valid_methods)):
        names = layer.get(key)
        if isinstance(names, list | tuple) and all(isinstance(n, str) for n in names):
            _check(key[:-1], key, names, valid)
    for key in ("models", "method_epochs"):
        if isinstance(layer.get(key), Mapping):
            _check("method", key, list(layer[key]), valid_methods)


def check_selection(args: argparse.Namespace) -> None:
    """:func:`check_names` of the ``--systems``, ``--methods`` and ``--config`` arguments."""
    check_names(
        systems=split_names(getattr(args, "systems", None)),
        methods=split_names(getattr(args, "methods", None)),
        config_file=getattr(args, "config", None),
    )
    check_storage(getattr(args, "storage", None))


def check_registry_uri(uri: str) -> None:
    """A model URI's form (:data:`tasks.tracking.model_uri.ACCEPTED`) and, in an embedded
    (sqlite) store, that what it names exists (:mod:`tasks.tracking.locations`, without
    MLflow). Raises :class:`UsageError` in one line (a registry URI's lists the registered
    models). A server store is asked later, through MLflow."""
    from tasks.tracking.locations import registered_version, stored_model, tracking_uri
    from tasks.tracking.model_uri import parse_model_uri

    try:
        parsed = parse_model_uri(uri)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if parsed.registered:
        sep = "@" if parsed.kind == "alias" else "/"
        found, names = registered_version(f"{parsed.name}{sep}{parsed.ref}")
        listed = f"; registered models: {', '.join(names) or 'none'}"
        what = "registered model version"
    else:
        found = stored_model(parsed.kind, parsed.model_id or parsed.run_id)
        listed, what = "", "logged model" if parsed.kind == "logged" else "run"
    if found is None or found:
        return  # there, or only MLflow itself can say (a server, an old or busy store)
    raise UsageError(f"no {what} at {uri!r} in {tracking_uri()}{listed}")
