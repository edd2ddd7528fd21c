"""Measurements as committed records: a benchmark script writes what it measured to
``results/measurements/NAME.json`` (the table, how it was made, where and when), and the docs'
generator (``python -m flows.docs_numbers``) renders it wherever a page holds the block
``measurement-NAME``: no measured figure is typed by hand."""

from __future__ import annotations

import json
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "FOLDER",
    "Measurement",
    "current_commit",
    "measurement_markdown",
    "read_measurement",
    "record_measurement",
    "show_measurement",
]

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "measurements"


@dataclass(frozen=True)
class Measurement:
    """One measured table: its columns and rows (already formatted), the command that makes it
    again, the machine, load and commit it was made on, and a sentence on how to read it."""

    name: str
    title: str
    command: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    machine: str
    commit: str
    note: str = ""


def _machine() -> str:
    import os

    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{name}, {os.cpu_count()} cores, load {load}"


def current_commit(root: Path = ROOT) -> str:
    """This checkout's commit (10 hex digits), and ``(with uncommitted changes)`` where its tracked
    files differ from it, records aside (``results/``: the ledger's records and checkpoints,
    written while it trains, change nothing that is measured); ``unknown`` without git."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=10", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        status = ["status", "--porcelain", "--untracked-files=no", "--", ":(top,exclude)results"]
        dirty = subprocess.run(
            ["git", "-C", str(root), *status],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record_measurement(
    name: str,
    title: str,
    command: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    note: str = "",
    folder: Path = FOLDER,
    machine: str | None = None,
) -> Path:
    """Write the record ``folder/name.json``; its path. ``machine``: where it was measured, when
    not this machine (a GPU node's results recorded here); by default this machine and load."""
    m = Measurement(
        name,
        title,
        command,
        tuple(columns),
        tuple(tuple(str(c) for c in r) for r in rows),
        machine or _machine(),
        current_commit(),
        note,
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(asdict(m), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def show_measurement(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    note: str = "",
    *,
    record: tuple[str, str, str] | None = None,
    folder: Path = FOLDER,
) -> Path | None:
    """Print a benchmark's table (Markdown) and ``note``; given ``record`` (its name, title and
    command line, ``--record`` included), also write it into ``folder``
    (:func:`record_measurement`) and say where. The path written, or None."""
    print(f"| {' | '.join(columns)} |\n|{'|'.join('---' for _ in columns)}|")
    for row in rows:
        print(f"| {' | '.join(map(str, row))} |")
    if note:
        print(f"\n{note}")
    if record is None:
        return None
    path = record_measurement(*record, columns, rows, note, folder)
    print(f"recorded {path}")
    return path


def read_measurement(path: Path) -> Measurement:
    data = json.loads(path.read_text(encoding="utf-8"))
    data["columns"] = tuple(data["columns"])
    data["rows"] = tuple(tuple(r) for r in data["rows"])
    return Measurement(**data)


def measurement_markdown(m: Measurement) -> str:
    """The record as a markdown table with its provenance."""
    lines = [
        f"| {' | '.join(m.columns)} |",
        f"|{'|'.join('---' for _ in m.columns)}|",
        *(f"| {' | '.join(r)} |" for r in m.rows),
        "",
        f"*{m.title}*: `{m.command}`, commit `{m.commit}`, {m.machine}."
        + (f" {m.note}" if m.note else ""),
    ]
    return "\n".join(lines)
