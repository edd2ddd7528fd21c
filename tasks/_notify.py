"""Telling the user something once per process (worker processes share the terminal)."""

from __future__ import annotations

import sys
import threading

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

__all__ = ["notify_once"]

_TOLD: set[str] = set()
_TOLD_LOCK = threading.Lock()


def notify_once(key: str, message: str) -> None:
    """Tell the user ``message`` once per ``key`` in this process: on the flow's log inside a
    Prefect run, else on stderr (worker processes share the terminal)."""
    with _TOLD_LOCK:
        if key in _TOLD:
            return
        _TOLD.add(key)
    try:
        from prefect import get_run_logger

        get_run_logger().warning(message)
    except Exception:  # no Prefect run here (a worker process, a plain call)
        print(f"nllab: {message}", file=sys.stderr, flush=True)
