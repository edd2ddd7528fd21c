"""``nllab benchmark``: train and evaluate systems × methods × seeds, tracked in MLflow."""

from __future__ import annotations

import argparse
import time

from flows.cli import common as cli

__all__ = ["add_parser", "run", "tuned_line"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "benchmark",
        help="train and evaluate systems × methods × seeds, tracked in MLflow",
        description="Run the main table. Finished cells (same config hash) are reused; failed "
        "or interrupted ones are run again.",
    )
    cli.add_selection(p)
    p.add_argument("--max-workers", type=int, metavar="N", help="cells trained at once")
    cli.add_training_options(p)
    cli.add_runner_options(p)
    p.add_argument("--no-progress", action="store_true", help="no per-epoch progress bars")
    p.add_argument(
        "--register",
        nargs="+",
        type=cli.names,
        metavar="METHOD",
        help="register the best model per system of these methods, each as @champion when it "
        "beats the last: all, none, or method names (default: neural_laplace)",
    )
    p.add_argument("--no-register", action="store_true", help="the same as --register none")
    p.add_argument(
        "--tuned",
        action="store_true",
        help="use the best configuration of each (system, method)'s `nllab tune` study",
    )
    p.add_argument("--storage", metavar="URL", help="Optuna storage of the tuned studies")
    p.add_argument(
        "--record",
        metavar="FILE",
        help="write the finished run to FILE (results/quick/PROFILE.json: the record the "
        "README's and the docs' figures are generated from)",
    )
    p.set_defaults(handler=run, precheck=precheck, computes=True)
    return p


def precheck(args: argparse.Namespace) -> None:
    """Names (systems, methods, those to register), the config file and the record's path,
    before the stack loads."""
    cli.check_selection(args)
    register = cli.split_names(args.register)
    if register and args.no_register and register != ["none"]:
        raise cli.UsageError(f"--no-register contradicts --register {' '.join(register)}")
    if register and not set(register) & {"all", "none"}:
        cli.check_names(register=register)
    elif register and len(register) > 1:
        raise cli.UsageError(f"--register takes all, none or method names, got {register}")
    if args.storage is not None and not args.tuned:
        raise cli.UsageError("--storage names where --tuned reads the studies; add --tuned")
    if args.record is not None:
        cli.check_writable("--record", args.record, "the file the finished run is written to")


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()  # the figure printed is the user's wait, imports and Prefect included
    config = cli.resolve(args)  # bad values answer before MLflow and Prefect load
    import nlmodels

    nlmodels.require_numerics()  # now, before any work: a lost portable mode is said first
    from flows.benchmark import run_benchmark
    from tasks.reports import number

    if args.tuned:
        from tasks.tuning import apply_tuned

        applied = apply_tuned(config, args.storage)
        config = applied.config
        print(tuned_line(applied, config.profile, args.storage))
    summary = run_benchmark(config)  # models that cannot fit in memory: refused before it starts
    print()
    print(summary.table.to_terminal())
    ranking = summary.table.ranking()
    if ranking.rows:
        from tasks.reports import render_table

        print(render_table(ranking, "terminal"))
    for r in summary.results:
        if r.ok and r.diverged is not None:
            print(
                f"cell {r.key} diverged ({r.diverged}): flagged in its run, never registered; "
                "try a smaller learning rate"
            )
    for p in summary.promotions:
        if p.promoted:
            print(
                f"registry: {p.name} version {p.version} is now @champion "
                f"(test RMSE {number(p.test_rmse)})"
            )
    counts = ", ".join(
        f"{summary.count(s)} {s}" for s in ("finished", "reused", "failed", "interrupted")
    )
    print(
        f"{len(summary.results)} cells: {counts}; {time.perf_counter() - t0:.0f} s "
        f"({summary.seconds:.0f} s in the flow)"
    )
    print(f"parent run {summary.parent_run_id}; compare the runs with: nllab ui")
    if args.record is not None:
        _record(args.record, config, summary, time.perf_counter() - t0)
    if not summary.ok:
        from flows.runtime import EnvironmentFault, fault_in_text

        # Cells failed by the machine (a full disk, a tracking server gone): exit 3, one line.
        faults = [f for r in summary.results if r.error and (f := fault_in_text(r.error))]
        if faults:
            raise EnvironmentFault(faults[0])
        print("some cells failed (see above); run the same command again to redo only those")
        return cli.EXIT_FAILED
    return 0


def _record(path: str, config, summary, wall_seconds: float) -> None:
    """``--record``: the finished cells and the command's seconds, into ``path``."""
    from tasks.ledger import record_benchmark
    from tasks.tracking import connect

    trained = summary.count("finished")
    run = record_benchmark(
        path,
        config,
        connect(config.tracking).queries,
        parent_run_id=summary.parent_run_id,
        wall_seconds=wall_seconds,
        flow_seconds=summary.seconds if trained else 0.0,
        cells_trained=trained,
        cells_reused=summary.count("reused"),
    )
    note = "" if trained else " (every cell reused: the seconds are not a training time)"
    print(f"recorded {len(run.cells)} cells and {run.wall_seconds:.0f} s in {path}{note}")


def tuned_line(applied, profile: str, storage: str | None) -> str:
    """What ``--tuned`` found: how many cells use a study's best configuration, and what the
    others keep (their profile's settings, not the paper's); with none found, where it looked."""
    from tasks.reports import plural
    from tasks.tuning import study_name
    from tasks.tuning.storage import default_storage_url, redact

    def cells(n: int) -> str:
        return plural(n, "cell")

    line = f"tuned configurations for {cells(len(applied.tuned))}"
    if applied.untuned:
        line += (
            f"; {cells(len(applied.untuned))} with no finished {profile}-profile study keep the "
            f"{profile} profile's configuration"
        )
    if not applied.tuned:
        names = sorted({study_name(c.method, c.system, profile) for c in applied.cells})
        shown = ", ".join(names[:3]) + (f", … ({len(names)} in all)" if len(names) > 3 else "")
        line += (
            f" (looked for studies {shown} in {redact(storage or default_storage_url())}; "
            "`nllab tune` prints the benchmark line that uses its study)"
        )
    return line
