"""Files written whole or not at all: the fingerprint cache's and the checkpoints'."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["write_atomically"]


def write_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """``write(file)`` into a temporary file beside ``path`` (``.<name>.<random>.tmp``), synced,
    then renamed over ``path``: a reader sees the old file or the new one, never a part; a
    write that fails leaves no temporary file (one killed midway leaves its ``.tmp``)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
