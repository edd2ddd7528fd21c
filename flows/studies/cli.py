"""``nllab study NAME --profile smoke|quick|paper [--systems …] [--seeds …] [--device …]``.

``add_study_parser(subparsers)`` registers the subcommand (``flows/cli.py`` wires it);
:func:`cmd_study` handles parsed arguments; :func:`main` runs it standalone (tests, scripts).
Exit codes as ``nllab``: 0 ok, 1 some cells failed, 2 usage/configuration error, 3 tracking
store unavailable, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import tasks._env  # noqa: F401  (offline switches before mlflow/prefect are imported)
from flows.cli import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TRACKING,
    EXIT_USAGE,
    add_runner_options,
    parse_seeds,
    split_names,
)

__all__ = ["add_study_parser", "cmd_study", "main"]


def add_study_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``study`` to an ``add_subparsers()`` object; returns the new parser."""
    from flows.studies import STUDIES
    from tasks.config import DEVICES, PROFILES

    lines = "\n".join(f"  {n:<17} {s.spec.title} — {s.spec.paper_ref}" for n, s in STUDIES.items())
    p = subparsers.add_parser(
        "study",
        help="run one of the paper's studies (ablations, noise, ILT, NFE, CMI, …)",
        description="Run a study of the paper as a tracked flow; its tables, figures and the "
        "paper's numbers are logged to one MLflow parent run. Finished cells are reused.\n\n"
        f"studies:\n{lines}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", metavar="NAME", help=f"one of: {', '.join(STUDIES)}")
    p.add_argument("--profile", choices=PROFILES, default="quick", help="default: quick")
    p.add_argument("--systems", nargs="+", metavar="NAME", help="default: the study's systems")
    p.add_argument("--methods", nargs="+", metavar="NAME", help="default: the study's models")
    p.add_argument("--seeds", nargs="+", metavar="N", help="seeds, e.g. 0 1 2 or 0,1,2")
    p.add_argument("--device", choices=DEVICES, help="default: auto")
    p.add_argument("--epochs", type=int, metavar="N", help="override the profile's epochs")
    p.add_argument("--max-workers", type=int, metavar="N", help="cells trained at once")
    add_runner_options(p)
    p.set_defaults(handler=cmd_study)
    return p


def _config(args: argparse.Namespace):
    from flows.studies import get_study, study_config

    get_study(args.name)  # unknown name: ValueError listing the valid ones
    seeds = parse_seeds(args.seeds)
    overrides: dict = {}
    if args.epochs is not None:
        overrides["training"] = {"epochs": args.epochs}
    for key in ("max_workers", "task_runner", "dask_address", "pack"):
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    config = study_config(
        args.name,
        args.profile,
        systems=split_names(args.systems),
        methods=split_names(args.methods),
        seeds=seeds,
        device=args.device,
        overrides=overrides,
    )
    if config.run.device == "cuda":
        from tasks.training import select_device

        select_device("cuda")  # RuntimeError with the reason when CUDA is absent
    return config


def cmd_study(args: argparse.Namespace) -> int:
    """Run the study; print its tables and where they are tracked."""
    from flows.studies import run_study
    from flows.studies._tables import to_markdown
    from tasks.tracking import TrackingUnavailable

    try:
        config = _config(args)
    except (ValueError, RuntimeError) as e:  # ConfigError is a ValueError
        print(f"nllab study: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        summary = run_study(config)
    except TrackingUnavailable as e:
        print(f"nllab study: {e}", file=sys.stderr)
        return EXIT_TRACKING
    except KeyboardInterrupt:
        print("interrupted; finished cells are kept and reused next time", file=sys.stderr)
        return EXIT_INTERRUPTED
    for name, table in summary.tables.items():
        print(f"\n## {name}\n")
        print(to_markdown(table))
    failed = [c for c in summary.cells if not c.ok]
    print(
        f"study {summary.study} ({summary.profile}): {len(summary.cells)} cells, "
        f"{sum(c.status == 'reused' for c in summary.cells)} reused, {len(failed)} failed; "
        f"{summary.seconds:.0f} s; parent run {summary.parent_run_id} "
        f"(artifacts under study/)"
    )
    for c in failed:
        print(f"  {c.key} {c.status}: {c.error}", file=sys.stderr)
    return EXIT_FAILED if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flows.studies.cli NAME …`` (the same arguments as ``nllab study``)."""
    parser = argparse.ArgumentParser(prog="nllab")
    sub = parser.add_subparsers(dest="command", required=True)
    add_study_parser(sub)
    args = parser.parse_args(["study", *(argv or [])])
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
