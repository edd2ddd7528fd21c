"""``nllab artifacts``: the Prefect artifacts of the latest benchmark (or any one, or a list of
every key), printed as the console prints tables, without starting a Prefect server."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from flows.cli import common as cli

if TYPE_CHECKING:
    from flows.runtime import StoredArtifact

__all__ = ["add_parser", "run"]

#: The artifacts a benchmark publishes, by key suffix, in the order they are shown.
_BENCHMARK_SUFFIXES = ("-results", "-comparison-table", "-comparison")
#: Columns that name a row (a cell's system and method): leading a table, they are repeated in
#: each block of a table too wide for the terminal.
_ROW_KEYS = ("system", "method", "cell", "seed")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "artifacts",
        help="the latest benchmark's Prefect artifacts (results and comparison tables)",
        description="Print the Prefect artifacts the flows publish, as the console prints its "
        "tables: by default the latest of each artifact of the latest benchmark "
        "(nllab-benchmark-PROFILE-results, its comparison with the earlier benchmark as a "
        "table and as Markdown). Read from the Prefect server at PREFECT_API_URL when one is "
        "set, else from the local Prefect database under PREFECT_HOME (no server is started; "
        "a database a run is writing to is read again after short waits). The Prefect UI "
        "shows every artifact's history.",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="list the latest artifact of every nllab key (studies too), one line each",
    )
    p.add_argument("--key", metavar="KEY", help="print the latest artifact under KEY")
    p.set_defaults(handler=run)
    return p


def _show(artifact) -> str:
    """An artifact as text: a table as the console table, Markdown as it is."""
    from tasks.reports import Table, TableCell, render_table

    head = f"{artifact.key} ({artifact.type}, {artifact.created} UTC): {artifact.description}"
    data = artifact.data
    if artifact.type == "table" and isinstance(data, list) and data:
        header = tuple(str(k) for k in data[0])
        rows = tuple(tuple(TableCell.of(r.get(k, "")) for k in header) for r in data)
        keys = next((i for i, k in enumerate(header) if k not in _ROW_KEYS), len(header))
        table = Table(header, rows, keys=max(keys, 1))
        return f"{head}\n{render_table(table, 'terminal')}"
    return f"{head}\n{data}"


def _benchmark_prefix(key: str) -> str | None:
    for suffix in _BENCHMARK_SUFFIXES:
        if key.startswith("nllab-benchmark-") and key.endswith(suffix):
            return key.removesuffix(suffix)
    return None


def _latest_benchmark(found: list[StoredArtifact]) -> list[StoredArtifact]:
    """The latest artifact under each key of the newest benchmark's profile; a comparison's
    Markdown only where it is not the table beside it."""
    prefix = next((p for a in found if (p := _benchmark_prefix(a.key))), None)
    if prefix is None:
        return []
    latest: dict[str, StoredArtifact] = {}
    for a in found:  # newest first
        latest.setdefault(a.key, a)
    shown = [latest[k] for s in _BENCHMARK_SUFFIXES if (k := prefix + s) in latest]
    table = latest.get(prefix + "-comparison-table")
    markdown = latest.get(prefix + "-comparison")
    if table is not None and markdown is not None:
        if str(markdown.data).startswith(f"# {table.description}"):
            shown.remove(markdown)  # the same comparison, already shown as the table
    return shown


def run(args: argparse.Namespace) -> int:
    from flows.runtime import ArtifactsUnreadable, EnvironmentFault, read_artifacts
    from tasks.reports import plural

    try:
        found, where = read_artifacts("nllab-")
    except ArtifactsUnreadable as e:
        raise EnvironmentFault(str(e)) from None
    if args.all:
        latest: dict[str, StoredArtifact] = {}
        for a in found:
            latest.setdefault(a.key, a)
        for a in latest.values():
            print(f"{a.key}  {a.type}  {a.created} UTC  {a.description}")
        print(f"{plural(len(latest), 'key')} in {where}")
        return 0
    if args.key:
        picked = next((a for a in found if a.key == args.key), None)
        if picked is None:
            raise cli.UsageError(f"no artifact under {args.key!r} in {where} (see --all)")
        chosen = [picked]
    else:
        chosen = _latest_benchmark(found)
        if not chosen:
            print(f"no benchmark artifacts in {where} yet: `nllab benchmark` publishes them")
            return 0
    print("\n\n".join(_show(a) for a in chosen))
    print(f"\n(read from {where}; every key: nllab artifacts --all; {_history(where)})")
    return 0


def _history(where: str) -> str:
    """Where the Prefect UI shows each artifact's history: the server's own UI, or one started
    on the local database."""
    if where.startswith("the Prefect server at "):
        ui = where.removeprefix("the Prefect server at ").removesuffix("/").removesuffix("/api")
        return f"their history: {ui}/artifacts"
    home = os.environ.get("PREFECT_HOME", "~/.prefect")
    return (
        f"their history: PREFECT_HOME={home} prefect server start, then "
        "http://127.0.0.1:4200/artifacts"
    )
