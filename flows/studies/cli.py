"""``nllab study NAME --profile smoke|quick|paper [--systems …] [--seeds …] [--device …]``.

``add_study_parser(subparsers)`` (from :mod:`flows.cli.study`) registers the subcommand;
:func:`cmd_study` handles parsed arguments; :func:`main` runs it standalone (tests, scripts).
Exit codes as ``nllab``: 0 ok, 1 some cells failed, 2 usage/configuration error, 3 tracking
store unavailable, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flows.cli._common import (
    EXIT_FAILED,
    UsageError,
    parse_seeds,
    split_names,
    training_overrides,
)
from flows.cli.study import add_parser as add_study_parser

__all__ = ["add_study_parser", "cmd_study", "main"]


def _config(args: argparse.Namespace):
    from flows.studies import get_study, study_config

    get_study(args.name)  # unknown name: ValueError listing the valid ones
    seeds = parse_seeds(args.seeds)
    overrides: dict = {}
    if training := training_overrides(args):
        overrides["training"] = training
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
    if config.run.execution.device == "cuda":
        from tasks.training import select_device

        select_device("cuda")  # RuntimeError with the reason when CUDA is absent
    return config


def cmd_study(args: argparse.Namespace) -> int:
    """Run the study; print its tables and where they are tracked."""
    from flows.studies import run_study
    from flows.studies._tables import to_markdown

    try:
        config = _config(args)
    except (ValueError, RuntimeError) as e:  # ConfigError is a ValueError; CUDA missing
        raise UsageError(str(e)) from None
    # Tracking unavailable and Ctrl-C propagate: flows.cli.main maps them to 3 and 130.
    summary = run_study(config)
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
    """``python -m flows.studies.cli NAME …``: ``nllab study NAME …`` (same exit codes)."""
    from flows.cli import main as nllab

    return nllab(["study", *(argv or [])])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
