"""The ``nllab`` command line.

Exit codes: 0 success; 1 some cells failed or a runtime error; 2 a usage or configuration error
(unknown name, bad value, missing GPU); 3 the tracking store cannot be reached; 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tasks._env  # noqa: F401  (offline switches before anything imports mlflow/prefect)

__all__ = [
    "add_runner_options",
    "build_parser",
    "main",
    "parse_seeds",
    "split_names",
    "ui_command",
]

EXIT_FAILED, EXIT_USAGE, EXIT_TRACKING, EXIT_INTERRUPTED = 1, 2, 3, 130


class _UsageError(ValueError):
    pass


def split_names(values: Sequence[str] | None) -> list[str] | None:
    """``--systems a,b c`` → ``[a, b, c]``."""
    if values is None:
        return None
    return [n for v in values for n in v.split(",") if n]


def parse_seeds(values: Sequence[str] | None) -> list[int] | None:
    """``--seeds 0 1,2`` → ``[0, 1, 2]``; a non-integer is a usage error (a ``ValueError``)."""
    names = split_names(values)
    if names is None:
        return None
    try:
        return [int(n) for n in names]
    except ValueError:
        raise _UsageError(
            f"--seeds takes non-negative integers, got {' '.join(values)!r}"
        ) from None


def add_runner_options(p: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--task-runner thread|dask`` and ``--dask-address``, shared by every flow command."""
    p.add_argument(
        "--task-runner",
        choices=("thread", "dask"),
        default=default,
        help="thread pool (default) or Dask (a local cluster unless --dask-address)",
    )
    p.add_argument("--dask-address", metavar="tcp://HOST:PORT", help="an existing Dask scheduler")


def _add_selection(
    p: argparse.ArgumentParser, *, methods: bool = True, device: bool = True
) -> None:
    from tasks.config import PROFILES

    p.add_argument("--profile", choices=PROFILES, help="size preset (default: quick)")
    p.add_argument("--config", metavar="FILE", help="TOML, JSON or YAML config file")
    p.add_argument("--systems", nargs="+", metavar="NAME", help="systems (default: main table)")
    if methods:
        p.add_argument("--methods", nargs="+", metavar="NAME", help="models (default: all six)")
    p.add_argument("--seeds", nargs="+", metavar="N", help="seeds, e.g. 0 1 2 or 0,1,2")
    if device:
        p.add_argument("--device", choices=("auto", "cpu", "cuda"), help="default: auto")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nllab",
        description="Neural Laplace Lab: the paper's benchmark as tracked Prefect flows "
        "(MLflow runs under $NLLAB_HOME, default ~/.nllab, unless MLFLOW_TRACKING_URI is set).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("simulate", help="simulate (or load from cache) the data sets")
    _add_selection(p, methods=False, device=False)

    p = sub.add_parser(
        "benchmark",
        help="train and evaluate systems × methods × seeds, tracked in MLflow",
        description="Run the main table. Finished cells (same config hash) are reused; failed "
        "or interrupted ones are run again.",
    )
    _add_selection(p)
    p.add_argument("--max-workers", type=int, metavar="N", help="cells trained at once")
    p.add_argument("--epochs", type=int, metavar="N", help="override the profile's epochs")
    add_runner_options(p)
    p.add_argument("--no-progress", action="store_true", help="no per-epoch progress bars")
    p.add_argument("--no-register", action="store_true", help="leave the model registry alone")
    p.add_argument(
        "--tuned",
        action="store_true",
        help="use the best configuration of each (system, method)'s `nllab tune` study",
    )
    p.add_argument("--storage", metavar="URL", help="Optuna storage of the tuned studies")

    p = sub.add_parser(
        "report",
        help="results table and the full HTML/Markdown report of finished runs (no training)",
        description="Rebuild the main table from finished runs, and one self-contained HTML "
        "report (plus Markdown) with every table and figure of the latest benchmark and study "
        "runs, each beside the paper's number with the gap marked.",
    )
    _add_selection(p)
    p.add_argument("--out", metavar="DIR", help="write results.{csv,md,tex} and report.* here")

    p = sub.add_parser("ui", help="start the MLflow UI on the tracking store")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument(
        "--allowed-hosts",
        metavar="HOSTS",
        help="host names the UI answers to when bound beyond localhost (MLflow's security check)",
    )
    from flows.reproduce import add_reproduce_parser, cmd_reproduce
    from flows.serve import add_serve_parser, cmd_serve
    from flows.studies.cli import add_study_parser, cmd_study
    from flows.tune import add_tune_parser, cmd_tune

    for add, handler in (
        (add_study_parser, cmd_study),
        (add_tune_parser, cmd_tune),
        (add_reproduce_parser, cmd_reproduce),
        (add_serve_parser, cmd_serve),
    ):
        add(sub).set_defaults(handler=handler)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    o: dict[str, Any] = {
        "systems": split_names(getattr(args, "systems", None)),
        "methods": split_names(getattr(args, "methods", None)),
        "seeds": parse_seeds(getattr(args, "seeds", None)),
        "device": getattr(args, "device", None),
        "max_workers": getattr(args, "max_workers", None),
        "task_runner": getattr(args, "task_runner", None),
        "dask_address": getattr(args, "dask_address", None),
    }
    if getattr(args, "epochs", None) is not None:
        o["training"] = {"epochs": args.epochs}
    if getattr(args, "no_progress", False):
        o["progress"] = False
    if getattr(args, "no_register", False):
        o["tracking"] = {"register_models": False}
    return o


def _resolve(args: argparse.Namespace):
    from tasks.config import resolve_config
    from tasks.training import select_device

    config = resolve_config(args.profile, args.config, _overrides(args))
    if config.device == "cuda":
        try:
            select_device("cuda")
        except RuntimeError as e:
            raise _UsageError(str(e)) from None
    return config


def _cmd_simulate(args: argparse.Namespace) -> int:
    from tasks.cell import simulate_data

    config = _resolve(args)
    for system in config.systems:
        for seed in config.seeds:
            t0 = time.perf_counter()
            ds = simulate_data(system, config.data, seed)
            print(
                f"{system:<24} seed {seed}  N={ds.x.shape[0]} T={ds.x.shape[1]} D={ds.x.shape[2]}"
                f"  fingerprint {ds.fingerprint[:12]}  {time.perf_counter() - t0:.1f} s"
            )
    return 0


def _cmd_benchmark(args: argparse.Namespace) -> int:
    from flows.benchmark import run_benchmark

    config = _resolve(args)
    if args.tuned:
        from tasks.tuning import apply_tuned

        applied = apply_tuned(config, args.storage)
        config = applied.config
        print(
            f"tuned configurations for {len(applied.tuned)} cells; "
            f"{len(applied.untuned)} cells have no finished study and keep the paper's"
        )
    summary = run_benchmark(config)
    print()
    print(summary.table.to_markdown())
    for p in summary.promotions:
        if p.promoted:
            print(
                f"registry: {p.name} version {p.version} is now @champion "
                f"(test RMSE {p.test_rmse:.4f})"
            )
    counts = ", ".join(
        f"{summary.count(s)} {s}" for s in ("finished", "reused", "failed", "interrupted")
    )
    print(f"{len(summary.results)} cells: {counts}; {summary.seconds:.0f} s")
    print(f"parent run {summary.parent_run_id}; compare the runs with: nllab ui")
    if not summary.ok:
        print("some cells failed (see above); run the same command again to redo only those")
        return EXIT_FAILED
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from datasets import data_home
    from flows.benchmark import stored_results
    from tasks.reporting import CellResult, results_table
    from tasks.tracking import Tracker

    config = _resolve(args)
    tracker = Tracker.connect(config.tracking)
    found, missing = stored_results(tracker, config.cells())
    results = found + [CellResult(c.system, c.method, c.seed, "missing") for c in missing]
    table = results_table(results)
    out = Path(args.out) if args.out else data_home() / "reports" / config.profile
    paths = table.write(out)
    print(table.to_markdown())
    print(
        f"{len(found)} of {len(results)} cells have finished runs; written: "
        + ", ".join(str(p) for p in paths)
    )
    from flows.report_full import build_report

    report = build_report(tracker, out)
    print(f"full report of the latest benchmark and study runs: {report.html} ({report.markdown})")
    return 0


def ui_command(host: str, port: int, allowed_hosts: str | None = None) -> tuple[list[str], str]:
    """The ``mlflow ui`` command for the configured store, and the address it will serve."""
    from tasks.tracking import TrackingSettings

    s = TrackingSettings.resolve()
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", s.tracking_uri]
    if s.artifact_root:
        cmd += ["--default-artifact-root", s.artifact_root]
    cmd += ["--host", host, "--port", str(port)]
    if allowed_hosts:
        cmd += ["--allowed-hosts", allowed_hosts]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return cmd, f"http://{shown}:{port}"


def _cmd_ui(args: argparse.Namespace) -> int:
    from tasks.tracking import Tracker, TrackingSettings

    settings = TrackingSettings.resolve()
    if settings.tracking_uri.startswith(("http://", "https://")):
        print(f"runs are tracked on the server {settings.tracking_uri}: open it in a browser")
        return 0
    Tracker.connect()  # creates the embedded store if needed; fails clearly if unusable
    cmd, address = ui_command(args.host, args.port, args.allowed_hosts)
    print(f"MLflow UI on {settings.tracking_uri}\n  open {address}  (Ctrl-C to stop)", flush=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    return subprocess.call(cmd, env=env)


_COMMANDS = {
    "simulate": _cmd_simulate,
    "benchmark": _cmd_benchmark,
    "report": _cmd_report,
    "ui": _cmd_ui,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nllab`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on usage errors, 0 on --help
    from datasets._cache import CacheError, require_writable_home
    from tasks.config import ConfigError
    from tasks.tracking import TrackingUnavailable

    try:
        require_writable_home()
        # study, tune, reproduce and serve carry their handler from their own modules
        handler = getattr(args, "handler", None) or _COMMANDS[args.command]
        return handler(args)
    except (ConfigError, _UsageError, CacheError) as e:
        print(f"nllab {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except TrackingUnavailable as e:
        print(f"nllab {args.command}: error: {e}", file=sys.stderr)
        return EXIT_TRACKING
    except KeyboardInterrupt:
        print(
            f"\nnllab {args.command}: interrupted; finished cells are kept, run again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
