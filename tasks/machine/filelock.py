"""One exclusive file lock between processes (``flock``), shared by the platform's files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["exclusive"]


@contextmanager
def exclusive(
    lock_path: Path, *, while_waiting: Callable[[], object] | None = None
) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if absent) for the block; where
    that is impossible (a read-only folder, no ``fcntl``) the block runs unlocked, and the
    caller's own fallback applies. ``while_waiting``: called once, before waiting, when another
    holds the lock (work that helps the holder, whose result the block then reads)."""
    try:
        import fcntl

        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        if while_waiting is not None and not _taken_at_once(fd):
            while_waiting()
        fcntl.flock(fd, fcntl.LOCK_EX)  # (a no-op where it was taken at once)
        yield
    finally:
        os.close(fd)


def _taken_at_once(fd: int) -> bool:
    """Whether the lock on ``fd`` is free and now held (False: another holds it)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
