"""The ``nllab`` command line.

Each subcommand has its own module here with ``add_parser(subparsers)`` and a ``run(args)``
handler that imports the heavy stack (torch, mlflow, prefect) only when the command runs, so
``--help`` and usage errors answer at once. Exit codes, mapped once in :func:`main`: 0 success;
1 some cells failed or a runtime error; 2 a usage or configuration error (unknown name, bad value,
missing GPU, busy port); 3 a fault of the environment (the tracking store, Optuna storage or Dask
scheduler cannot be reached, a full disk: one line, the traceback in ``$NLLAB_HOME/logs``);
130 Ctrl-C and 143 SIGTERM, one stop path for both (:mod:`tasks.stopping`): running cells end
KILLED, finished ones are kept. A simulator or plugin that calls ``sys.exit`` is an error line
naming its function (exit 1), never a silent 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flows.cli import (
    artifacts,
    benchmark,
    compare,
    doctor,
    ledger,
    models,
    report,
    reproduce,
    serve,
    simulate,
    study,
    systems,
    tune,
    ui,
)
from flows.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TRACKING,
    EXIT_USAGE,
    CommandFailed,
    Parser,
    UsageError,
    add_runner_options,
    check_device,
    parse_seeds,
    split_names,
)
from flows.cli.ui import ui_command
from tasks import configure_environment

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_TRACKING",
    "EXIT_USAGE",
    "add_runner_options",
    "build_parser",
    "main",
    "parse_seeds",
    "split_names",
    "ui_command",
]

#: Subcommands in the order ``nllab --help`` lists them.
_SUBCOMMANDS = (
    simulate,
    benchmark,
    report,
    compare,
    artifacts,
    ui,
    study,
    tune,
    reproduce,
    serve,
    ledger,
    systems,
    models,
    doctor,
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="nllab",
        description="Neural Laplace Lab: the paper's benchmark as tracked Prefect flows "
        "(MLflow runs under $NLLAB_HOME, default ~/.nllab, unless MLFLOW_TRACKING_URI is set).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def _check_home():
    """The home and the environment a command that trains or tracks needs, checked at once."""
    from datasets import require_writable_home
    from flows.cli.common import check_environment, check_store_paths
    from flows.runtime import check_free_space, reserve_log_space
    from tasks.scratch import remove_stale_scratch

    check_environment()
    home = require_writable_home()
    check_store_paths(home)
    check_free_space(home)
    reserve_log_space(home)
    remove_stale_scratch()  # cells' folders a killed process left in /tmp
    return home


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nllab`` console script; returns the exit code. As the program
    itself (``argv`` None: the console script, ``python -m flows.cli``) the process ends with
    the command's work (:func:`flows.runtime._leftovers.end_with_work`): processes user code started
    are stopped, threads it left do not keep the process alive, a stop signal during the exit
    gives ``128 + signal``."""
    args = build_parser().parse_args(argv)  # exits 2 on usage errors, 0 on --help
    if argv is not None:
        return _command(args)
    from flows.runtime import adopt_orphans, end_with_work

    adopt_orphans()
    try:
        code = _command(args)
    except Exception:
        import traceback

        traceback.print_exc()  # as the interpreter would, before the process ends below
        code = EXIT_FAILED
    return end_with_work(args.command, code)


def _command(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; its exit code."""
    configure_environment()  # offline switches and tracking defaults, before the stack loads
    import nlmodels  # its names load on first use: the numerics below import nothing heavy

    try:  # the CPU numerics' environment before torch computes (inherited by every worker)
        nlmodels.set_up_numerics(defer=True)
    except ValueError as e:
        print(f"nllab {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if note := nlmodels.numerics_note():
        print(f"nllab: {note}", file=sys.stderr)
    from tasks.config import ConfigError
    from tasks.stopping import UserCodeExit, contained, stop_signals

    home = None
    try:
        # Ctrl-C and SIGTERM: one path (running cells end KILLED), 130 or 143.
        with stop_signals(abandon=lambda code: _abandon(args.command, code)):
            if getattr(args, "computes", False):
                check_device(args)  # --device cuda without CUDA: before anything loads
            if (check := getattr(args, "precheck", None)) is not None:
                check(args)  # names, files, registry URIs: before torch, MLflow or Prefect load
            reads_only = getattr(args, "reads_only", None)
            if (reads_only is None or not reads_only(args)) and not getattr(
                args, "checks_home", False
            ):  # (a command that only reads files; doctor, which reports the home itself)
                home = _check_home()
                if getattr(args, "computes", False):
                    _say_numerics(args.command)
            with contained():  # user code (a simulator, a plugin) leaving by sys.exit
                return args.handler(args)
    except (ConfigError, UsageError, CommandFailed, UserCodeExit) as e:
        print(f"nllab {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, ConfigError | UsageError) else EXIT_FAILED
    except KeyboardInterrupt as e:
        print(f"\nnllab {args.command}: {_interrupted(args.command)}", file=sys.stderr)
        return getattr(e, "exit_code", EXIT_INTERRUPTED)  # 143 for SIGTERM
    except Exception as e:
        from datasets import CacheError
        from flows.runtime import describe_fault, write_log

        if isinstance(e, CacheError):
            print(f"nllab {args.command}: error: {e}", file=sys.stderr)
            # the home itself (not writable, not a folder): the environment; else a setting
            return EXIT_TRACKING if home is None else EXIT_USAGE
        # A full disk, a server gone: one line naming it; the traceback goes to a log file.
        if (fault := describe_fault(e, home)) is not None:
            log = write_log(args.command, e, home)
            where = f" (details: {log})" if log is not None else ""
            print(f"nllab {args.command}: error: {fault}{where}", file=sys.stderr)
            return EXIT_TRACKING
        from tasks.errors import SettingError

        if isinstance(e, SettingError):  # a setting to change
            print(f"nllab {args.command}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        raise


def _say_numerics(command: str) -> None:
    """The CPU numerics of a command that computes: when they are not the ones asked for (no C
    compiler, no writable kernel cache, a failed self-test), one line says so as they take
    effect, before any work (after the usage errors, which load no torch), with what it means
    for the bytes and the fix."""
    import nlmodels

    def told(_setup) -> None:
        if line := nlmodels.numerics_downgrade():
            print(f"nllab {command}: warning: {line}", file=sys.stderr)

    nlmodels.on_numerics_effect(told)


def _interrupted(command: str) -> str:
    kept = "" if command == "serve" else "; finished cells are kept, run again to resume"
    return f"interrupted{kept}"


def _abandon(command: str, code: int) -> None:
    """Work still running long after a stop signal (user code that hangs), or a second signal:
    the process ends now, saying so in one line (a thread stuck in user code can be neither
    stopped nor joined)."""
    import os

    from flows.runtime import end_children

    line = f"{_interrupted(command)} (work still running was abandoned)"
    try:
        end_children()  # what user code started ends with the command
        print(f"\nnllab {command}: {line}", file=sys.stderr, flush=True)
        sys.stdout.flush()
    finally:
        os._exit(code)
