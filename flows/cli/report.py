"""``nllab report``: the results table and the full report of finished runs (no training)."""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli._common import UsageError, add_selection, check_selection, resolve

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="results table and the full HTML/Markdown report of finished runs (no training)",
        description="Rebuild the main table from finished runs, and one self-contained HTML "
        "report (plus Markdown) with every table and figure of the latest benchmark and study "
        "runs, each beside the paper's number with the gap marked.",
    )
    add_selection(
        p, profile_help="size preset (default: the profile of the latest finished benchmark)"
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
    p.set_defaults(handler=run, precheck=check_selection)
    return p


def check_out_folder(out: str | None) -> None:
    """``--out`` must name a folder (existing or not): a :class:`UsageError` if it, or a folder
    above it, is a file."""
    if not out:
        return
    path = Path(out)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            what = "is a file" if p == path else f"is below {str(p)!r}, a file"
            raise UsageError(f"--out {out!r} {what}; --out names the folder the report goes into")


def run(args: argparse.Namespace) -> int:
    check_out_folder(args.out)
    # With a profile named, bad values fail here, before MLflow loads.
    config = resolve(args) if args.profile else None
    # Loading MLflow and reading every run takes seconds: say so before the first result.
    print("nllab report: loading MLflow and reading the tracking store …", flush=True)
    from flows.report_full import report_command

    return report_command(args, config)
