"""Generated blocks read from measurement records (:mod:`tasks.reports.measurements`): the test
suite's wall time and the training speed against the reference package; :mod:`flows.docs_numbers`
lists them with the others."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["minutes", "speed_claim", "suite_time"]


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min ({seconds:.0f} s)"


def _seconds(wall: str) -> float:
    """The seconds of a recorded wall time, ``6 min 1 s (361 s)``."""
    found = re.search(r"\((\d+(?:\.\d+)?) s\)", wall)
    return float(found.group(1)) if found else float("nan")


def suite_time(root: Path) -> str:
    """``make test``'s wall time from its timed runs (``benchmarks/suite_time.py --record``):
    the latest run's tests and time, with the range of times and loads of every kept run."""
    from tasks.reports import read_measurement

    path = root / "results" / "measurements" / "suite_time.json"
    if not path.is_file():
        return "`make test` is not timed yet (`benchmarks/suite_time.py --record` times it)."
    m = read_measurement(path)
    command, _, tests = m.rows[0][:3]
    commit = m.rows[0][5] if len(m.rows[0]) > 5 else m.commit
    times = sorted(_seconds(r[1]) for r in m.rows)
    loads = sorted(float(x) for r in m.rows for x in (*r[3].split(","), *r[4].split(",")))
    machine = m.machine.split(", load ")[0]
    span = (
        f"{minutes(times[0])} to {minutes(times[-1])} over its last {len(m.rows)} timed runs"
        if len(times) > 1 and times[-1] > times[0]
        else f"{minutes(times[0])} in its one timed run"
    )
    return (
        f"`make test` ({command}) took {span}, on {machine} at load {loads[0]:.1f} to "
        f"{loads[-1]:.1f} (1, 5 and 15-minute averages, before and after each run); the latest, "
        f"at commit `{commit}`: {tests}. The time is a wall time: it grows with the load "
        f"beside the suite. Timed by `{m.command}`."
    )


def speed_claim(root: Path) -> str:
    """Neural Laplace's CPU training epoch against the reference package's, and what the
    portable numerics cost against the native ones, from one recorded run
    (``benchmarks/portable_speed.py --record``)."""
    from tasks.reports import read_measurement

    path = root / "results" / "measurements" / "portable_speed.json"
    if not path.is_file():
        return "The training speed is not measured yet (`benchmarks/portable_speed.py --record`)."
    m = read_measurement(path)
    rows = {row[0]: row for row in m.rows}
    ratios = sorted(float(row[3]) for row in m.rows)
    cost = (
        f"the default numerics, bit-identical on every x86-64 CPU, take "
        f"{ratios[0]:.2f}–{ratios[-1]:.2f}× the native mode's epoch over the {len(m.rows)} main "
        "models"
    )
    nl = rows.get("neural_laplace")
    where = f"one run on {m.machine.split(', load ')[0]}, commit `{m.commit}`"
    if nl is None or nl[5] in ("", "–"):
        return f"In {where}, {cost} (`benchmarks/portable_speed.py`)."
    return (
        f"Neural Laplace trains {nl[5]}× as fast as the reference package (torchlaplace) on the "
        f"CPU, {nl[2]} s an epoch against {nl[4]} s (paper configuration, one thread; {where}); "
        f"{cost} (`benchmarks/portable_speed.py`)."
    )
