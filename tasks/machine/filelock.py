"""One exclusive file lock between processes (``flock``), shared by the platform's files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["exclusive"]


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if absent) for the block; where
    that is impossible (a read-only folder, no ``fcntl``) the block runs unlocked, and the
    caller's own fallback applies."""
    try:
        import fcntl

        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
