"""``nllab study NAME``: one of the paper's studies as a tracked flow."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from flows.cli import common as cli

__all__ = ["add_parser", "run", "study_help"]


def _describe() -> str:
    from flows._study_catalog import STUDY_CATALOG  # no Prefect: help comes at once

    lines = "\n".join(f"  {e.name:<17} {e.title} — {e.paper_ref}" for e in STUDY_CATALOG.values())
    return (
        "Run a study of the paper as a tracked flow; its tables, figures and the paper's numbers "
        f"are logged to one MLflow parent run. Finished cells are reused.\n\nstudies:\n{lines}"
    )


def study_help(name: str) -> str:
    """The description ``nllab study NAME --help`` prints: the study's title, the paper's table
    or figure it reproduces, and its module's docstring (read from the file, not imported)."""
    from flows._study_catalog import STUDY_CATALOG

    entry = STUDY_CATALOG[name]
    source = Path(__file__).resolve().parent.parent / "studies" / f"{name.replace('-', '_')}.py"
    try:
        doc = ast.get_docstring(ast.parse(source.read_text())) or ""
    except (OSError, SyntaxError):
        doc = ""
    text = f"nllab study {name}: {entry.title}.\nPaper: {entry.paper_ref}."
    if doc:
        text += "\n\n" + doc.replace("``", "`")
    text += (
        "\n\nIts tables, figures and the paper's numbers are logged to one MLflow parent run; "
        "finished cells are reused."
    )
    return text


class _StudyHelp(argparse.Action):
    """``-h/--help``: after a study's name (``nllab study noise --help``), that study's help;
    otherwise the list of studies."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from flows._study_catalog import STUDY_CATALOG

        name = getattr(namespace, "name", None)
        if name in STUDY_CATALOG:
            parser.describe = None
            parser.description = study_help(name)
            parser.usage = f"nllab study {name} [options]"
        parser.print_help()
        parser.exit()


def add_parser(sub) -> argparse.ArgumentParser:
    from tasks.config import DEVICES, PROFILES

    p = sub.add_parser(
        "study",
        help="run one of the paper's studies (ablations, noise, ILT, NFE, CMI, …)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    p.add_argument(
        "-h", "--help", action=_StudyHelp, help="show this help (after NAME: that study's help)"
    )
    p.describe = _describe  # built only when help is shown
    p.add_argument("name", metavar="NAME", help="a study (listed above; `nllab study --help`)")
    p.add_argument("--profile", choices=PROFILES, default="quick", help="default: quick")
    p.add_argument(
        "--systems", nargs="+", type=cli.names, metavar="NAME", help="default: the study's systems"
    )
    p.add_argument(
        "--methods", nargs="+", type=cli.names, metavar="NAME", help="default: the study's models"
    )
    p.add_argument(
        "--seeds", nargs="+", type=cli.names, metavar="N", help="seeds, e.g. 0 1 2 or 0,1,2"
    )
    p.add_argument("--device", choices=DEVICES, help="default: auto")
    cli.add_training_options(
        p, budget_default="quick profile: 20, with 30 epochs and patience 10; paper: none"
    )
    p.add_argument("--max-workers", type=int, metavar="N", help="cells trained at once")
    cli.add_runner_options(p)
    p.set_defaults(handler=run, precheck=precheck, computes=True)
    return p


def precheck(args: argparse.Namespace) -> None:
    """The study's name and the system and method names, before the heavy stack loads."""
    from flows._study_catalog import STUDY_CATALOG

    if args.name not in STUDY_CATALOG:
        raise cli.UsageError(
            f"unknown study {args.name!r}; valid studies: {', '.join(STUDY_CATALOG)}"
        )
    cli.check_names(systems=cli.split_names(args.systems), methods=cli.split_names(args.methods))


def _config(args: argparse.Namespace):
    """The :class:`~flows.studies.StudyConfig` the arguments ask for."""
    from flows.studies import get_study, study_config

    get_study(args.name)  # unknown name: ValueError listing the valid ones
    seeds = cli.parse_seeds(args.seeds)
    overrides: dict = {}
    if training := cli.training_overrides(args):
        overrides["training"] = training
    for key in ("max_workers", "task_runner", "dask_address"):
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    overrides |= cli.runner_overrides(args)
    config = study_config(
        args.name,
        args.profile,
        systems=cli.split_names(args.systems),
        methods=cli.split_names(args.methods),
        seeds=seeds,
        device=args.device,
        overrides=overrides,
    )
    if config.run.execution.device == "cuda":
        from nltrain import select_device

        select_device("cuda")  # RuntimeError with the reason when CUDA is absent
    return config


def run(args: argparse.Namespace) -> int:
    """Handler of ``nllab study``: run the study; print its tables and where they are tracked.
    0 every cell finished or reused, 1 some failed; tracking unavailable and Ctrl-C propagate
    (:func:`flows.cli.main` maps them to 3 and 130)."""
    from flows.studies import run_study
    from tasks.reports import Table, plural, render_table

    try:
        config = _config(args)
    except (ValueError, RuntimeError) as e:  # ConfigError is a ValueError; CUDA missing
        raise cli.UsageError(str(e)) from None
    cli.check_tracking_server()  # down: exit 3 now, not after Prefect has started
    summary = run_study(config)
    for name, table in summary.tables.items():  # as the benchmark prints its table
        print(f"\n{name}\n")
        print(render_table(Table.from_frame(table), "terminal"))
    failed = [c for c in summary.cells if not c.ok]
    print(
        f"study {summary.study} ({summary.profile}): {plural(len(summary.cells), 'cell')}, "
        f"{sum(c.status == 'reused' for c in summary.cells)} reused, {len(failed)} failed; "
        f"{summary.seconds:.0f} s; parent run {summary.parent_run_id} "
        f"(artifacts under study/)"
    )
    for c in failed:
        print(f"  {c.key} {c.status}: {c.error}", file=sys.stderr)
    return cli.EXIT_FAILED if failed else 0
