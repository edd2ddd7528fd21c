"""``nllab serve``: scheduled deployments (the flows and their schedules:
:mod:`flows.serve.deployments`; serving them beside other instances:
:mod:`flows.serve.serve_loop`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flows.cli.common import EXIT_TRACKING, UsageError, port

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve",
        help="serve scheduled deployments (benchmark nightly, studies weekly)",
        description="Build Prefect deployments with cron schedules from a schedules file and "
        "serve them until Ctrl-C. Needs a Prefect server (PREFECT_API_URL) or --start-server.",
    )
    p.add_argument(
        "--config", metavar="FILE", help="schedules file (default flows/serve/schedules.toml)"
    )
    p.add_argument(
        "--start-server", action="store_true", help="start a local Prefect server if none is set"
    )
    p.add_argument("--port", type=port, default=4200, help="port for --start-server")
    p.add_argument("--check", action="store_true", help="validate and list, do not serve")
    p.set_defaults(handler=run, precheck=precheck, computes=True)
    return p


def precheck(args: argparse.Namespace) -> None:
    """A schedules file named but missing answers before Prefect loads."""
    if args.config is not None and not Path(args.config).is_file():
        raise UsageError(f"schedules file {args.config!r} does not exist")


def run(args: argparse.Namespace) -> int:
    """Handler of ``nllab serve``: 2 on a malformed schedule or no server, 3 when the server
    does not start, does not answer or stops answering, else serves until Ctrl-C (130) or
    SIGTERM (143)."""
    from flows.runtime import prefect_server
    from flows.serve import ScheduleError, load_schedules

    try:
        entries = load_schedules(args.config)
    except ScheduleError as e:
        raise UsageError(str(e)) from None
    for entry in entries:
        state = " (paused)" if entry.paused else ""
        print(f"  {entry.name:<44} {entry.flow:<9} cron '{entry.cron}' {entry.timezone}{state}")
    if args.check:
        return 0
    server = None
    api = prefect_server.api_url()
    try:
        if not api and args.start_server:
            server, api = prefect_server.start_server(args.port)
            print(f"started a Prefect server: {api} (UI http://127.0.0.1:{args.port})")
        api = prefect_server.require_server(api)
    except prefect_server.ServerMissing as e:
        raise UsageError(str(e)) from None
    if server is None:
        prefect_server.require_answer(api)  # a dead PREFECT_API_URL: one line, exit 3
    from flows.serve import serve_deployments

    try:
        outcome = serve_deployments(entries, api)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    if outcome.server_lost:
        print(
            f"nllab serve: error: the Prefect server at {api} stopped answering; "
            "stopped serving (start the server again, then run `nllab serve`)",
            file=sys.stderr,
        )
        return EXIT_TRACKING
    kept = outcome.kept
    print(
        f"nllab serve: interrupted; paused {len(outcome.paused)} deployments"
        + (f"; {kept} stay served by another nllab serve" if kept else ""),
        file=sys.stderr,
    )
    return 128 + outcome.signum  # 130 for Ctrl-C, 143 for SIGTERM
