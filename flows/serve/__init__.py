"""``nllab serve``: the schedules file (``flows/serve/schedules.toml`` by default, read and
validated by :mod:`._schedules` without Prefect), the scheduled flows built from it
(:mod:`.deployments`) and the loop that serves them (:mod:`.serve_loop`).

Names load on first use (PEP 562): a schedules file is checked without loading Prefect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlmodels.lazy import lazy_face

if TYPE_CHECKING:
    from flows.serve._schedules import (
        DEFAULT_SCHEDULES,
        BenchmarkEntry,
        ScheduleError,
        StudyEntry,
        load_schedules,
    )
    from flows.serve.deployments import build_deployments
    from flows.serve.serve_loop import serve_deployments

_LAZY = {
    "ScheduleError": "_schedules",
    "load_schedules": "_schedules",
    "BenchmarkEntry": "_schedules",
    "StudyEntry": "_schedules",
    "DEFAULT_SCHEDULES": "_schedules",
    "build_deployments": "deployments",
    "serve_deployments": "serve_loop",
}

__all__ = [
    "DEFAULT_SCHEDULES",
    "BenchmarkEntry",
    "ScheduleError",
    "StudyEntry",
    "build_deployments",
    "load_schedules",
    "serve_deployments",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
