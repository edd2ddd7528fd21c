"""``nllab reproduce``: re-evaluate a registered model (handler in :mod:`flows.reproduce`)."""

from __future__ import annotations

import argparse

from flows.cli._common import UsageError, add_runner_options, check_registry_uri

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "reproduce",
        help="re-evaluate a registered model from its recorded config, then ablate it",
        description="Rebuild the data of a registered model's run, check that its weights give "
        "the logged test RMSE (to 1e-9), and optionally re-run an ablation from its config. "
        "The registry is only read.",
    )
    p.add_argument("model_uri", metavar="MODEL_URI", help="e.g. models:/neural-laplace-X@champion")
    p.add_argument(
        "--ablation",
        metavar="NAME",
        help="factor to vary: stereographic, latent-dim, ilt, noise, … (a wrong name lists all)",
    )
    p.add_argument("--max-workers", type=int, default=2, metavar="N")
    add_runner_options(p, default="thread")
    p.add_argument(
        "--fresh-data", action="store_true", help="re-simulate instead of reading the data cache"
    )
    p.set_defaults(handler=run, precheck=precheck)
    return p


def precheck(args: argparse.Namespace) -> None:
    """The ablation's name and the registry URI (in an embedded store, that the version
    exists), before the heavy stack loads."""
    from flows._study_catalog import ABLATIONS

    if args.ablation is not None and args.ablation not in ABLATIONS:
        raise UsageError(f"unknown ablation {args.ablation!r}; valid: {', '.join(ABLATIONS)}")
    check_registry_uri(args.model_uri)


def run(args: argparse.Namespace) -> int:
    from flows.reproduce import cmd_reproduce

    return cmd_reproduce(args)
