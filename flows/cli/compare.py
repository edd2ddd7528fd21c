"""``nllab compare``: the latest benchmark beside the previous one of the same experiment."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from flows.cli import common as cli

if TYPE_CHECKING:
    from tasks.tracking import Queries

__all__ = ["add_parser", "comparison_section", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "compare",
        help="the latest benchmark beside the previous one of the same experiment; exit 1 "
        "when a cell regressed",
        description="Per cell: test RMSE before and after, which numerics fingerprint changed "
        "(model, data set) and a verdict: unchanged (the same bits), within spread (the seed "
        "spread of the earlier benchmark), regressed or improved beyond it. Exit code 1 when "
        "a cell regressed (for CI and schedules), 0 otherwise.",
    )
    p.add_argument("--run", metavar="RUN_ID", help="the benchmark run (default: the latest)")
    p.add_argument(
        "--against",
        metavar="RUN_ID",
        help="the earlier benchmark run (default: the previous one of the same experiment)",
    )
    p.add_argument(
        "--format", choices=("terminal", "markdown"), default="terminal", help="output format"
    )
    p.set_defaults(handler=run)
    return p


def comparison_section(queries: Queries, run_id: str | None = None, against: str | None = None):
    """``(text, comparison)`` of :func:`flows.compare.compare_benchmarks`; the comparison is
    ``None`` (and the text says why) when there is nothing to compare."""
    from flows.compare import NoComparison, UnknownRun, compare_benchmarks

    try:
        comparison = compare_benchmarks(queries, run_id, against)
    except UnknownRun as e:
        raise cli.UsageError(str(e)) from None
    except NoComparison as e:
        return f"nothing to compare: {e}", None
    return comparison.to_markdown(), comparison


def run(args: argparse.Namespace) -> int:

    from tasks.tracking.locations import has_finished_run, tracking_uri

    if not args.run and has_finished_run("benchmark") is False:  # answered without MLflow
        print(f"nothing to compare: no finished benchmark in {tracking_uri()}")
        return 0
    from tasks.tables import Table, render_table
    from tasks.tracking import connect

    queries = connect().queries
    if args.against and not args.run:
        raise cli.UsageError("--against needs --run (the benchmark to compare with it)")
    text, comparison = comparison_section(queries, args.run, args.against)
    if comparison is None:
        print(text)
        return 0
    import pandas as pd

    if args.format == "markdown":
        print(text, end="")
    else:
        rows = comparison.rows()
        print(comparison.summary())
        if rows:
            frame = pd.DataFrame(rows).rename(columns={"verdict": "outcome"})  # not paper marks
            print(render_table(Table.from_frame(frame), "terminal"))
    if comparison.regressions:
        n = comparison.regressions
        print(f"{n} cell{'s' if n != 1 else ''} regressed")
        return cli.EXIT_FAILED
    return 0
