"""The placement probes' cache file (``$NLLAB_HOME/placement.json``): entries read leniently,
merged under an exclusive ``flock`` and replaced atomically, so concurrent processes never
drop each other's entries (:mod:`tasks.machine.placement` keys and fills it)."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tasks.machine.filelock import exclusive

__all__ = ["locked", "merge_entries", "read_entries"]

_LOCK = threading.Lock()


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` next to ``path`` (threads of this process: also ``_LOCK``); in a
    read-only home, the thread lock only (entries may then not be kept)."""
    with _LOCK:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        with exclusive(path.with_suffix(".lock")):
            yield


def read_entries(path: Path) -> dict[str, dict[str, float]]:
    """The cache's entries; any of another shape (valid JSON written by something else, or
    by hand) is left out, so it is measured again and rewritten."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        key: entry
        for key, entry in data.items()
        if isinstance(entry, dict)
        and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in entry.values()
        )
    }


def merge_entries(path: Path, entries: Mapping[str, Mapping[str, float]]) -> None:
    """Merge ``entries`` into the file (the caller holds the lock): what others wrote stays."""
    merged = read_entries(path)
    for key, value in entries.items():
        merged[key] = {**merged.get(key, {}), **value}
    try:
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(merged, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home only costs a probe next time
