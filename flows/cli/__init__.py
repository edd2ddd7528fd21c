"""The ``nllab`` command line.

Each subcommand has its own module here with ``add_parser(subparsers)`` and a ``run(args)``
handler that imports the heavy stack (torch, mlflow, prefect) only when the command runs, so
``--help`` and usage errors answer at once. Exit codes, mapped once in :func:`main`: 0 success;
1 some cells failed or a runtime error; 2 a usage or configuration error (unknown name, bad value,
missing GPU, busy port); 3 the tracking store cannot be reached; 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flows.cli import benchmark, report, reproduce, serve, simulate, study, tune, ui
from flows.cli._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TRACKING,
    EXIT_USAGE,
    Parser,
    UsageError,
    add_runner_options,
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
_SUBCOMMANDS = (simulate, benchmark, report, ui, study, tune, reproduce, serve)


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nllab`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)  # exits 2 on usage errors, 0 on --help
    configure_environment()  # offline switches and tracking defaults, before the stack loads
    from tasks.config import ConfigError

    try:
        if (check := getattr(args, "precheck", None)) is not None:
            check(args)  # names, files, registry URIs: before torch, MLflow or Prefect load
        from datasets._cache import require_writable_home

        require_writable_home()
        return args.handler(args)
    except (ConfigError, UsageError) as e:
        print(f"nllab {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(
            f"\nnllab {args.command}: interrupted; finished cells are kept, run again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except Exception as e:
        cache = sys.modules.get("datasets._cache")
        if cache is not None and isinstance(e, cache.CacheError):
            print(f"nllab {args.command}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        # The tracking adapter is loaded by now if the store was the problem.
        tracking = sys.modules.get("tasks.tracking")
        if tracking is not None and isinstance(e, tracking.TrackingUnavailable):
            print(f"nllab {args.command}: error: {e}", file=sys.stderr)
            return EXIT_TRACKING
        raise
