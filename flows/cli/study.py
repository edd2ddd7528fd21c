"""``nllab study NAME``: one of the paper's studies as a tracked flow."""

from __future__ import annotations

import argparse

from flows.cli._common import add_runner_options, add_training_options

__all__ = ["add_parser", "run"]


def _describe() -> str:
    from flows._study_catalog import STUDY_CATALOG  # no Prefect: help comes at once

    lines = "\n".join(f"  {e.name:<17} {e.title} — {e.paper_ref}" for e in STUDY_CATALOG.values())
    return (
        "Run a study of the paper as a tracked flow; its tables, figures and the paper's numbers "
        f"are logged to one MLflow parent run. Finished cells are reused.\n\nstudies:\n{lines}"
    )


def add_parser(sub) -> argparse.ArgumentParser:
    from tasks.config import DEVICES, PROFILES

    p = sub.add_parser(
        "study",
        help="run one of the paper's studies (ablations, noise, ILT, NFE, CMI, …)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.describe = _describe  # built only when help is shown
    p.add_argument("name", metavar="NAME", help="a study (listed above; `nllab study --help`)")
    p.add_argument("--profile", choices=PROFILES, default="quick", help="default: quick")
    p.add_argument("--systems", nargs="+", metavar="NAME", help="default: the study's systems")
    p.add_argument("--methods", nargs="+", metavar="NAME", help="default: the study's models")
    p.add_argument("--seeds", nargs="+", metavar="N", help="seeds, e.g. 0 1 2 or 0,1,2")
    p.add_argument("--device", choices=DEVICES, help="default: auto")
    add_training_options(p)
    p.add_argument("--max-workers", type=int, metavar="N", help="cells trained at once")
    add_runner_options(p)
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    from flows.studies.cli import cmd_study

    return cmd_study(args)
