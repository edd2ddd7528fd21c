"""``nllab reproduce``: re-evaluate a registered model (the flow: :mod:`flows.reproduce`)."""

from __future__ import annotations

import argparse

from flows.cli import common as cli

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "reproduce",
        help="re-evaluate a registered or logged model from its recorded config, then ablate it",
        description="Rebuild the data of a registered model's run, check that its weights give "
        "the logged test RMSE (to 1e-9), and optionally re-run an ablation from its config. "
        "The registry is only read.",
    )
    p.add_argument(
        "model_uri",
        metavar="MODEL_URI",
        help="models:/NAME@ALIAS, models:/NAME/VERSION, models:/m-<logged model id> or "
        "runs:/<run id>/model (e.g. models:/neural-laplace-integro_de@champion)",
    )
    p.add_argument(
        "--ablation",
        metavar="NAME",
        help="factor to vary: stereographic, latent-dim, ilt, noise, … (a wrong name lists all)",
    )
    p.add_argument("--max-workers", type=cli.positive_int, default=2, metavar="N")
    cli.add_runner_options(p, default="thread", checkpoints=False)
    p.add_argument(
        "--fresh-data", action="store_true", help="re-simulate instead of reading the data cache"
    )
    p.set_defaults(handler=run, precheck=precheck, computes=True)
    return p


def precheck(args: argparse.Namespace) -> None:
    """The ablation's name and the registry URI (in an embedded store, that the version
    exists), before the heavy stack loads."""
    from flows._study_catalog import ABLATIONS

    if args.ablation is not None and args.ablation not in ABLATIONS:
        raise cli.UsageError(f"unknown ablation {args.ablation!r}; valid: {', '.join(ABLATIONS)}")
    cli.check_registry_uri(args.model_uri)


def run(args: argparse.Namespace) -> int:
    """Handler of ``nllab reproduce``: 0 reproduced, 1 mismatch, 2 unknown URI or ablation."""
    from flows.reproduce import DataMismatch, ReproductionMismatch, ablation_table, reproduce

    try:
        result = reproduce(
            args.model_uri,
            args.ablation,
            max_workers=args.max_workers,
            task_runner=args.task_runner,
            dask_address=args.dask_address,
            fresh_data=args.fresh_data,
            pack=args.pack is not False,
            reuse=args.reuse or "numerics",
        )
    except (LookupError, ValueError) as e:  # an unknown URI or ablation
        raise cli.UsageError(str(e)) from None
    except (DataMismatch, ReproductionMismatch) as e:
        raise cli.CommandFailed(str(e)) from None
    v = result.verification
    print(
        f"{v.ref.uri} = {v.ref.label} (run {v.ref.run_id}): "
        f"test RMSE {v.test_rmse:.12g}, logged {v.logged_rmse:.12g} "
        f"(|diff| {v.difference:.2g}) - reproduced"
    )
    if result.ablation:
        print(ablation_table(result.ablation, list(result.cells), "terminal"))
        print(f"ablation runs are nested under run {result.run_id} (linked to {v.ref.run_id})")
    failed = [r for _, r in result.cells if not r.ok]
    return cli.EXIT_FAILED if failed else 0
