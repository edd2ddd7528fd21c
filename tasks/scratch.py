"""Scratch folders of a cell (its figures and model, written there before they are logged),
and their removal when a killed process left them behind.

A scratch folder is named after the process that made it (its pid and start time: a recycled
pid does not pass for it), so a later start removes exactly the folders of processes that no
longer run (``kill -9``, a power cut), and never a live one's. Standard library only: the
command line cleans up before anything heavy loads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from tasks.tracking.processes import process_alive, process_token

__all__ = ["SCRATCH_PREFIX", "cell_scratch", "remove_stale_scratch"]

#: How a cell's scratch folder starts, in the temporary folder.
SCRATCH_PREFIX = "nllab-cell-"


def cell_scratch() -> tempfile.TemporaryDirectory:
    """A temporary folder for one cell's files, named ``nllab-cell-PID_START-…``."""
    token = (process_token(os.getpid()) or str(os.getpid())).replace(":", "_")
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{token}-")


def remove_stale_scratch(folder: Path | None = None) -> list[Path]:
    """Remove the cell scratch folders in ``folder`` (default: the temporary folder) whose
    process has ended; the folders removed. Folders of older versions (no process in their
    name) are removed once a day old."""
    folder = Path(folder or tempfile.gettempdir())
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        # ``PID_START-random`` (random parts never hold "-"), else an older version's name
        token, dash, _ = entry.name.removeprefix(SCRATCH_PREFIX).partition("-")
        try:
            if dash and token.split("_", 1)[0].isdigit():
                stale = not process_alive(token.replace("_", ":"))
            else:
                stale = entry.stat(follow_symlinks=False).st_mtime < time.time() - 86400.0
            if stale and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue  # removed meanwhile, or not ours to remove
    return removed
