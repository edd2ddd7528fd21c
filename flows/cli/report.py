"""``nllab report``: the results table and the full report of finished runs (no training)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flows.cli import common as cli

if TYPE_CHECKING:
    from tasks.config import RunConfig
    from tasks.tracking import Queries, StoredRun

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="results table and the full HTML/Markdown report of finished runs (no training)",
        description="Rebuild the main table from finished runs, and one self-contained HTML "
        "report (plus Markdown) with every table and figure of the latest benchmark and study "
        "runs, each beside the paper's number with the gap marked.",
    )
    cli.add_selection(
        p,
        profile_help="size preset (default: that of the latest finished benchmark with at least "
        "one finished or reused cell, named when chosen)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write results.{csv,md,tex} and report.* here (default $NLLAB_HOME/reports/PROFILE)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace report files in --out that this command did not write",
    )
    p.add_argument(
        "--mlflow-ui",
        metavar="URL",
        help="address of a running MLflow UI: run ids become links to it "
        "(default $NLLAB_MLFLOW_UI, or the tracking server)",
    )
    p.set_defaults(handler=run, precheck=cli.check_selection)
    return p


def check_out_folder(out: str | None) -> None:
    """``--out`` must name a folder (existing or not) that can be written or made: a
    :class:`~flows.cli.common.UsageError` if it, or a folder above it, is a file."""
    if out:
        cli.check_writable("--out", out, "the folder the report goes into", folder=True)


def run(args: argparse.Namespace) -> int:
    check_out_folder(args.out)
    # With a profile named, bad values fail here, before MLflow loads.
    config = cli.resolve(args) if args.profile else None
    # Loading MLflow and reading every run takes seconds: say so before the first result.
    print("nllab report: loading MLflow and reading the tracking store …", flush=True)
    return _report(args, config)


def _selection_given(args: argparse.Namespace) -> bool:
    return any(
        getattr(args, k, None) is not None
        for k in ("profile", "config", "systems", "methods", "seeds")
    )


def _report(args: argparse.Namespace, config: RunConfig | None) -> int:
    """``nllab report``: 0 written; 1 nothing finished matches; 2 files in the way.

    ``config``: the configuration to report, already resolved from the arguments; ``None``
    takes the latest finished benchmark's with results (with ``--systems``, … applied to its
    profile).
    """
    from flows.reports import benchmark_of, stored_cell_results
    from tasks.reports import results_table
    from tasks.tracking import connect

    queries = connect(config.tracking if config else None).queries
    if config is None:
        if (chosen := _latest_config(args, queries)) is None:
            return cli.EXIT_FAILED
        config, queries = chosen
    # the benchmark of these cells: which of them it trained, and what it is compared with
    run = benchmark_of(queries, config.profile, (c.config_hash() for c in config.cells()))
    results = stored_cell_results(queries, config, run.run_id if run is not None else None)
    found = sum(r.ok for r in results)
    if not found:
        print(
            f"nllab report: 0 of {len(results)} cells of profile {config.profile!r} have finished "
            f"runs in {queries.settings.tracking_uri}; nothing to report",
            file=sys.stderr,
        )
        return cli.EXIT_FAILED
    table = results_table(results, profile=config.profile)
    print(table.to_terminal(color=sys.stdout.isatty()))
    paths = _write_report(args, queries, config.profile, results)
    print(f"{found} of {len(results)} cells have finished runs{_trained(results, run)}")
    print(f"\n## Since the previous benchmark (`nllab compare`)\n\n{_comparison(queries, run)}")
    print(f"written: {', '.join(str(p) for p in paths.results)}")
    print(f"full report of the latest benchmark and study runs: {paths.html} ({paths.markdown})")
    return 0


def _latest_config(args: argparse.Namespace, queries: Queries) -> tuple[RunConfig, Queries] | None:
    """The configuration of the latest finished benchmark with at least one finished or reused
    cell (its profile with the arguments' selection applied, when one is given) and the queries
    of its store; ``None`` (said on stderr) when there is none to report."""
    from flows.reports import benchmark_config, describe_run
    from tasks.tracking import connect

    latest = benchmark_config(queries)
    if _selection_given(args):
        config = cli.resolve(args, profile=latest[0].profile if latest else None)
        return config, connect(config.tracking).queries
    if latest is None:
        print(
            f"nllab report: no finished benchmark with results in "
            f"{queries.settings.tracking_uri}: run `nllab benchmark --profile smoke` first, or "
            "name one with --profile",
            file=sys.stderr,
        )
        return None
    chosen = describe_run(queries.get_run_data(latest[1]))
    print(f"reporting the latest benchmark with results:\n  {chosen}")
    return latest[0], queries


def _write_report(args: argparse.Namespace, queries: Queries, profile: str, results):
    """The report files under ``--out`` (default ``$NLLAB_HOME/reports/PROFILE``); a folder
    that cannot take them is a :class:`~flows.cli.common.UsageError` (a full disk is said as
    such)."""
    from datasets import data_home
    from flows.reports import UnownedFiles, build_report

    out = Path(args.out) if args.out else data_home() / "reports" / profile
    ui = getattr(args, "mlflow_ui", None) or os.environ.get("NLLAB_MLFLOW_UI")
    if ui is None and queries.settings.tracking_uri.startswith(("http://", "https://")):
        ui = queries.settings.tracking_uri
    try:
        return build_report(
            queries, out, results=results, profile=profile, ui_address=ui, force=args.force
        )
    except UnownedFiles as e:
        raise cli.UsageError(str(e)) from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # a full disk: exit 3, said as such
        where = e.filename or out
        raise cli.UsageError(
            f"--out {str(out)!r}: cannot write {str(where)!r} ({e.strerror or e}); "
            "name another folder"
        ) from None


def _trained(results, run: StoredRun | None) -> str:
    """``: N trained by benchmark RUN, M reused from earlier runs`` (what that benchmark did)."""
    trained = sum(r.status == "finished" for r in results)
    reused = sum(r.status == "reused" for r in results)
    if run is None:
        return ": every one from an earlier run (no finished benchmark of these cells)"
    return f": {trained} trained by benchmark {run.run_id}, {reused} reused from earlier runs"


def _comparison(queries: Queries, run: StoredRun | None) -> str:
    """Benchmark ``run`` (the one of the reported cells) beside the earlier one of its profile
    and cells (changed cells only)."""
    from flows.reports import comparison_rows, comparison_section, comparison_summary

    if run is None:
        return "nothing to compare: no finished benchmark of these cells"
    text, comparison = comparison_section(queries, run.run_id)
    if comparison is None:
        return text
    changed = [r for r in comparison_rows(comparison) if r["verdict"] != "unchanged"]
    lines = [comparison_summary(comparison)]
    lines += [
        f"  {r['cell']}: {r['before']} -> {r['after']} ({r['change']}; fingerprint changed: "
        f"{r['fingerprint']}): {r['verdict']}"
        for r in changed
    ]
    return "\n".join(lines)
