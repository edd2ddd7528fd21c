"""``nllab serve``: scheduled deployments (handler in :mod:`flows.serve`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli._common import UsageError

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve",
        help="serve scheduled deployments (benchmark nightly, studies weekly)",
        description="Build Prefect deployments with cron schedules from a schedules file and "
        "serve them until Ctrl-C. Needs a Prefect server (PREFECT_API_URL) or --start-server.",
    )
    p.add_argument("--config", metavar="FILE", help="schedules file (default flows/schedules.toml)")
    p.add_argument(
        "--start-server", action="store_true", help="start a local Prefect server if none is set"
    )
    p.add_argument("--port", type=int, default=4200, help="port for --start-server")
    p.add_argument("--check", action="store_true", help="validate and list, do not serve")
    p.set_defaults(handler=run, precheck=precheck)
    return p


def precheck(args: argparse.Namespace) -> None:
    """A schedules file named but missing answers before Prefect loads."""
    if args.config is not None and not Path(args.config).is_file():
        raise UsageError(f"schedules file {args.config!r} does not exist")


def run(args: argparse.Namespace) -> int:
    from flows.serve import cmd_serve

    return cmd_serve(args)
