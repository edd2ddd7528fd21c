"""``nllab compare``: the latest benchmark beside the earlier one of the same cells and profile."""

from __future__ import annotations

import argparse
import math

from flows.cli import common as cli

__all__ = ["add_parser", "run"]

#: The default of ``--rtol`` (:data:`tasks.reports.comparison.RTOL`, not imported: ``--help`` stays
# light).
_RTOL = 0.05


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "compare",
        help="the latest benchmark beside the earlier one of the same cells; exit 1 when a "
        "cell regressed",
        description="Per cell: test RMSE before and after, which numerics fingerprint changed "
        "(model, data set) and a verdict: unchanged (equal up to rounding: a relative "
        "difference of at most 1e-9), within tolerance (changed by no more than the larger of "
        "the seeds' spread of its system and method in the earlier benchmark and --rtol of the "
        "earlier value), regressed or improved beyond it, new or gone. By default the latest "
        "finished benchmark with at least one finished or reused cell is compared with the "
        "newest such benchmark before it of the same profile and cells (config hashes); both "
        "are named. Exit code 1 when a cell regressed (for CI and schedules), 0 otherwise.",
    )
    p.add_argument(
        "--run", metavar="RUN_ID", help="the benchmark run (default: the latest with results)"
    )
    p.add_argument(
        "--against",
        metavar="RUN_ID",
        help="the earlier benchmark run (default: the newest before it of the same cells)",
    )
    p.add_argument(
        "--rtol",
        type=_fraction,
        default=_RTOL,
        metavar="FRACTION",
        help=f"relative tolerance of a change where the seeds' spread is smaller (default "
        f"{_RTOL}: 5%% of the earlier test RMSE)",
    )
    p.add_argument(
        "--format", choices=("terminal", "markdown"), default="terminal", help="output format"
    )
    p.set_defaults(handler=run, precheck=precheck)
    return p


def precheck(args: argparse.Namespace) -> None:
    """Options that need each other, before any store is read."""
    if args.against and not args.run:
        raise cli.UsageError("--against needs --run (the benchmark to compare with it)")


def run(args: argparse.Namespace) -> int:
    from tasks.tracking.locations import has_finished_run, tracking_uri

    if not args.run and has_finished_run("benchmark") is False:  # answered without MLflow
        print(f"nothing to compare: no finished benchmark in {tracking_uri()}")
        return 0
    from flows.reports import UnknownRun, comparison_rows, comparison_section, comparison_summary
    from tasks.reports import Table, render_table
    from tasks.tracking import connect

    queries = connect().queries
    try:
        text, comparison = comparison_section(queries, args.run, args.against, args.rtol)
    except UnknownRun as e:
        raise cli.UsageError(str(e)) from None
    if comparison is None:
        print(text)
        return 0
    import pandas as pd

    if args.format == "markdown":
        print(text, end="")
    else:
        rows = comparison_rows(comparison)
        print(comparison_summary(comparison))
        if rows:
            frame = pd.DataFrame(rows).rename(columns={"verdict": "outcome"})  # not paper marks
            print(render_table(Table.from_frame(frame), "terminal"))
    if comparison.regressions:
        n = comparison.regressions
        print(f"{n} cell{'s' if n != 1 else ''} regressed")
        return cli.EXIT_FAILED
    return 0
