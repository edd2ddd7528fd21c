"""Benchmarks over time: a benchmark beside the earlier one of the same cells and profile.

This module finds the two benchmarks and their cells in the store, and prints; the verdicts are
:mod:`tasks.reports.comparison`'s (``unchanged`` up to rounding, ``within tolerance`` of the seeds'
spread or a relative tolerance, ``regressed`` / ``improved`` beyond it, ``new`` / ``gone``).

By default the later benchmark is the latest finished one with at least one cell that finished
or was reused (one whose every cell failed has nothing to compare), and the earlier one the
newest such benchmark started before it with the same profile and the same cells: the same set
of config hashes (which no code change alters: the ``nllab.cells_hash`` tag, or for a run from
before that tag its recorded cells) or the same experiment hash. A benchmark's cells (reused
ones too, which are not its child runs) are its ``cells.json`` artifact (:func:`cells_record`).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from tasks.reports import ROUNDING, RTOL, Comparison, compare_cells, plural
from tasks.results import CellResult
from tasks.tracking import Metrics, Queries, RunTags, StoredRun, Tracking

__all__ = [
    "CELLS_ARTIFACT",
    "NoComparison",
    "UnknownRun",
    "benchmark_of",
    "benchmark_runs",
    "cells_hash",
    "cells_record",
    "clock_went_back",
    "compare_benchmarks",
    "comparison_markdown",
    "comparison_rows",
    "comparison_section",
    "comparison_summary",
    "describe_run",
    "record_comparison",
]

#: The parent run's record of its cells (reused ones included).
CELLS_ARTIFACT = "cells.json"


class NoComparison(LookupError):
    """There is no benchmark, or no earlier one of the same cells and profile, to compare."""


class UnknownRun(NoComparison):
    """A run named to compare is not a finished benchmark run."""


def cells_record(results: Iterable[CellResult]) -> str:
    """The ``cells.json`` text of a benchmark's results (one object per cell)."""
    return json.dumps([asdict(r) for r in results], indent=1, default=str)


def cells_hash(config_hashes: Iterable[str]) -> str:
    """What a benchmark's cells are: a hash of their config hashes (order and repeats aside)."""
    text = "\n".join(sorted(set(config_hashes)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: How far in the future a run may seem to have started before the clock is said to have gone
#: back (clocks of one machine drift by seconds, not minutes).
CLOCK_SLACK_SECONDS = 300.0


def benchmark_runs(queries: Queries) -> list[StoredRun]:
    """The finished benchmark runs with at least one cell that finished or was reused, newest
    first (a run from before those counts were tagged counts as having some). Newest by their
    start times, MLflow's only order: where one started later than now, the clock went back
    since, the order may not be the order they were made in (:func:`clock_went_back`)."""
    return [
        r
        for r in queries.finished_runs("benchmark")
        if r.cells_with_results is None or r.cells_with_results > 0
    ]


def clock_went_back(runs: Sequence[StoredRun], now: float | None = None) -> str | None:
    """One line when some of ``runs`` started later than ``now`` (seconds since the epoch,
    default the clock's): the clock went back since, and an order by start times (MLflow's
    only one) may not be the order the runs were made in. None when none did."""
    now = time.time() if now is None else now
    ahead = [r for r in runs if r.start_time / 1000 > now + CLOCK_SLACK_SECONDS]
    if not ahead:
        return None
    return (
        f"the clock went back: {plural(len(ahead), 'benchmark run')} started later than now "
        f"({describe_run(ahead[-1])}; now {_started(int(now * 1000))}): runs are ordered by "
        "their start times, so the latest or the earlier one may not be the one you think; "
        "name them (nllab compare --run RUN --against RUN)"
    )


def benchmark_of(queries: Queries, profile: str, config_hashes: Iterable[str]) -> StoredRun | None:
    """The latest finished benchmark with results of ``profile`` whose cells are these
    (``config_hashes``), else the latest of ``profile`` (a selection of its cells), else
    ``None``: the benchmark a report of these cells speaks of, whatever ran since in other
    profiles."""
    cells = _Cells(queries)
    wanted = cells_hash(config_hashes)
    of_profile = [r for r in benchmark_runs(queries) if r.profile == profile]
    same = next((r for r in of_profile if cells.identity(r) == wanted), None)
    return same or next(iter(of_profile), None)


def _started(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def describe_run(run: StoredRun) -> str:
    """``RUN_ID (profile P, YYYY-MM-DD HH:MM UTC, N of M cells with results)``: which run."""
    done, total = run.cells_with_results, run.cells
    counts = f", {done} of {total} cells with results" if done is not None and total else ""
    return f"{run.run_id} (profile {run.profile or '?'}, {_started(run.start_time)}{counts})"


def _cells_of(queries: Queries, run_id: str) -> list[dict]:
    """The cells of benchmark run ``run_id`` (its ``cells.json``; an older run without it: its
    child cell runs)."""
    with tempfile.TemporaryDirectory(prefix="nllab-compare-") as tmp:
        try:
            path = queries.download(run_id, CELLS_ARTIFACT, tmp)
            return json.loads(Path(path).read_text())
        except Exception:  # an older benchmark: its own child runs only
            pass
    return [
        {
            "system": r.tags.get(RunTags.SYSTEM),
            "method": r.tags.get(RunTags.METHOD),
            "seed": int(r.tags.get(RunTags.SEED, 0)),
            "status": "finished",
            Metrics.TEST_RMSE: r.metrics.get(Metrics.TEST_RMSE),
            "run_id": r.run_id,
            "config_hash": r.tags.get(RunTags.CONFIG_HASH),
        }
        for r in queries.child_runs(run_id)
        if r.kind == "cell" and r.finished
    ]


def _fingerprints(queries: Queries, cells: Sequence[dict]) -> dict[str, tuple[str, str] | None]:
    runs = queries.runs_by_id(c["run_id"] for c in cells if c.get("run_id"))
    return {run_id: run.numerics for run_id, run in runs.items()}


class _Cells:
    """The cells of benchmark runs, each read from the store once."""

    def __init__(self, queries: Queries) -> None:
        self.queries = queries
        self._read: dict[str, list[dict]] = {}

    def __call__(self, run_id: str) -> list[dict]:
        if run_id not in self._read:
            self._read[run_id] = _cells_of(self.queries, run_id)
        return self._read[run_id]

    def identity(self, run: StoredRun) -> str:
        """The run's cells: its ``nllab.cells_hash`` tag, else from its recorded cells."""
        recorded = (c.get("config_hash") for c in self(run.run_id))
        return run.cells_hash or cells_hash(h for h in recorded if h)


def _same_cells(cells: _Cells, run: StoredRun, after: StoredRun) -> bool:
    if run.profile != after.profile:
        return False
    if after.experiment_hash is not None and run.experiment_hash == after.experiment_hash:
        return True
    return cells.identity(run) == cells.identity(after)


def _pair(
    queries: Queries, cells: _Cells, run_id: str | None, against: str | None
) -> tuple[StoredRun, StoredRun]:
    """Benchmark run ``run_id`` (default: the latest with results) and the one it is compared
    with (default: the newest with results before it of the same cells and profile)."""
    finished = {r.run_id: r for r in queries.finished_runs("benchmark")}
    if (line := clock_went_back(list(finished.values()))) is not None:
        print(f"nllab: {line}", file=sys.stderr)
    if run_id is None:
        with_results = benchmark_runs(queries)
        if not with_results:
            raise NoComparison(
                f"no finished benchmark with results in {queries.settings.tracking_uri}"
            )
        run_id = with_results[0].run_id
    if run_id not in finished:
        raise UnknownRun(f"{run_id} is not a finished benchmark run")
    after = finished[run_id]
    if against is None:
        older = (
            r
            for r in benchmark_runs(queries)
            if r.start_time < after.start_time and _same_cells(cells, r, after)
        )
        before = next(older, None)
        if before is None:
            raise NoComparison(
                f"no earlier finished benchmark of the same cells and profile as "
                f"{describe_run(after)} to compare with"
            )
        return after, before
    if against not in finished:
        raise UnknownRun(f"{against} is not a finished benchmark run")
    return after, finished[against]


def compare_benchmarks(
    queries: Queries, run_id: str | None = None, against: str | None = None, rtol: float = RTOL
) -> Comparison:
    """Benchmark ``run_id`` beside ``against`` (defaults: see the module), each cell judged
    by :func:`tasks.reports.comparison.judge` with relative tolerance ``rtol``.
    :class:`NoComparison` when either is missing, :class:`UnknownRun` when a named run is not a
    finished benchmark."""
    cells = _Cells(queries)
    after_run, before_run = _pair(queries, cells, run_id, against)
    after, before = cells(after_run.run_id), cells(before_run.run_id)
    changes = compare_cells(after, before, _fingerprints(queries, [*after, *before]), rtol)
    return Comparison(
        after_run.run_id,
        before_run.run_id,
        after_run.profile or "?",
        changes,
        rtol,
        after_run.start_time,
        before_run.start_time,
    )


# -- printing -----------------------------------------------------------------------------------
def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:+.4g}" if signed else f"{value:.6g}"


def comparison_summary(c: Comparison) -> str:
    """One line: which two benchmarks, how many cells of each verdict, by which tolerance."""
    counts = ", ".join(
        f"{c.count(v)} {v}"
        for v in ("unchanged", "within tolerance", "regressed", "improved", "new", "gone")
        if c.count(v) or v in ("unchanged", "regressed")
    )
    return (
        f"benchmark {c.after_run} (started {_started(c.after_start)}) against the earlier one "
        f"of the same cells ({c.before_run}, started {_started(c.before_start)}, profile "
        f"{c.profile}): {plural(len(c.cells), 'cell')}: {counts} (tolerance: the larger of the "
        f"seeds' spread and {c.rtol:.3g} of the earlier value; within {ROUNDING:.0e} relative: "
        "unchanged)"
    )


def comparison_rows(c: Comparison) -> list[dict[str, object]]:
    """One row per cell (the console table and the Prefect table artifact), changed first."""
    return [
        {
            "cell": x.key,
            "before": _fmt(x.before),
            "after": _fmt(x.after),
            "change": _fmt(x.delta, signed=True),
            "spread": _fmt(x.spread),
            "fingerprint": x.changed or "-",
            "verdict": x.verdict,
        }
        for x in c.ordered()
    ]


def comparison_markdown(c: Comparison) -> str:
    rows = comparison_rows(c)
    head = list(rows[0]) if rows else []
    lines = [f"# {comparison_summary(c)}", ""]
    if rows:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def comparison_section(
    queries: Queries, run_id: str | None = None, against: str | None = None, rtol: float = RTOL
) -> tuple[str, Comparison | None]:
    """``(text, comparison)`` of :func:`compare_benchmarks`; the comparison is ``None`` (and
    the text says why) when there is nothing to compare. :class:`UnknownRun` propagates."""
    try:
        comparison = compare_benchmarks(queries, run_id, against, rtol)
    except NoComparison as e:
        if isinstance(e, UnknownRun):
            raise
        return f"nothing to compare: {e}", None
    return comparison_markdown(comparison), comparison


def record_comparison(tracking: Tracking, run_id: str) -> Comparison | None:
    """Compare benchmark ``run_id`` with the earlier one of its cells and record it: on the run
    (the ``regressions`` metric, ``comparison.md``) and as the Prefect artifacts of the current
    flow run (the comparison as a table and as Markdown, keyed by profile). ``None`` (and a
    ``comparison.md`` saying so) when there is nothing to compare with."""
    from flows.runtime import artifact_key, publish_markdown, publish_table

    comparison: Comparison | None
    try:
        comparison = compare_benchmarks(tracking.queries, run_id)
    except NoComparison as e:
        comparison, text, profile = None, f"# Nothing to compare\n\n{e}\n", None
    else:
        text, profile = comparison_markdown(comparison), comparison.profile
    profile = profile or tracking.queries.get_run_data(run_id).profile or "run"
    tracking.runs.log_text(run_id, text, "comparison.md")
    regressions = comparison.regressions if comparison is not None else 0
    tracking.runs.log_metrics(run_id, {Metrics.REGRESSIONS: regressions})
    key = artifact_key("benchmark", profile, "comparison")
    if comparison is not None:
        table = comparison_rows(comparison)
        publish_table(key + "-table", table, comparison_summary(comparison))
    publish_markdown(key, text, f"Benchmark {profile} against the earlier one (run {run_id})")
    return comparison
