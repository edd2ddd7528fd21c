"""Benchmarks over time: the latest benchmark beside the previous one of the same experiment.

Per cell (system, method, seed): the test RMSE before and after, which numerics fingerprint of
its runs differs (:mod:`tasks.numerics`: the model's, the data set's) and a verdict:

* ``unchanged``: the same bits (the same run reused, or a retrained run that gave them again);
* ``within spread``: changed by no more than the seed spread of its (system, method) in the
  earlier benchmark (the population standard deviation of test RMSE over its seeds; with one
  seed there is no spread, and any change is judged as below);
* ``regressed`` / ``improved``: worse / better beyond it (a cell that failed now and finished
  before has regressed);
* ``new`` / ``gone``: in one of the two only.

A benchmark's cells (reused ones too, which are not its child runs) are its ``cells.json``
artifact (:func:`cells_record`); "the same experiment" is its ``nllab.experiment_hash`` tag.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from tasks.results import CellResult
from tasks.tracking import Metrics, Queries, RunTags, Tracking

__all__ = [
    "CELLS_ARTIFACT",
    "CellChange",
    "Comparison",
    "NoComparison",
    "UnknownRun",
    "cells_record",
    "compare_benchmarks",
    "record_comparison",
]

#: The parent run's record of its cells (reused ones included).
CELLS_ARTIFACT = "cells.json"
Verdict = Literal["unchanged", "within spread", "regressed", "improved", "new", "gone"]


class NoComparison(LookupError):
    """There is no benchmark, or no earlier one of the same experiment, to compare."""


class UnknownRun(NoComparison):
    """A run named to compare is not a finished benchmark run."""


def cells_record(results: Iterable[CellResult]) -> str:
    """The ``cells.json`` text of a benchmark's results (one object per cell)."""
    return json.dumps([asdict(r) for r in results], indent=1, default=str)


@dataclass(frozen=True)
class CellChange:
    """One cell in both benchmarks."""

    key: str
    system: str
    method: str
    before: float | None
    after: float | None
    spread: float
    changed: str  # "model", "data set", "model, data set", "" (none) or "not recorded"
    verdict: Verdict

    @property
    def delta(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before


@dataclass(frozen=True)
class Comparison:
    """The cells of benchmark ``after_run`` beside those of ``before_run``."""

    after_run: str
    before_run: str
    profile: str
    cells: tuple[CellChange, ...]

    def count(self, verdict: Verdict) -> int:
        return sum(c.verdict == verdict for c in self.cells)

    @property
    def regressions(self) -> int:
        return self.count("regressed")

    def summary(self) -> str:
        counts = ", ".join(
            f"{self.count(v)} {v}"
            for v in ("unchanged", "within spread", "regressed", "improved", "new", "gone")
            if self.count(v) or v in ("unchanged", "regressed")
        )
        return (
            f"benchmark {self.after_run} against the previous one of the same experiment "
            f"({self.before_run}, profile {self.profile}): {len(self.cells)} cells: {counts}"
        )

    def rows(self) -> list[dict[str, object]]:
        """One row per cell (the Prefect table artifact), changed cells first."""
        order = ["regressed", "improved", "within spread", "new", "gone", "unchanged"]
        cells = sorted(self.cells, key=lambda c: (order.index(c.verdict), c.key))
        return [
            {
                "cell": c.key,
                "before": _fmt(c.before),
                "after": _fmt(c.after),
                "change": _fmt(c.delta, signed=True),
                "spread": _fmt(c.spread),
                "fingerprint": c.changed or "-",
                "verdict": c.verdict,
            }
            for c in cells
        ]

    def to_markdown(self) -> str:
        rows = self.rows()
        head = list(rows[0]) if rows else []
        lines = [f"# {self.summary()}", ""]
        if rows:
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
        return "\n".join(lines) + "\n"


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:+.4g}" if signed else f"{value:.6g}"


def _cells_of(queries: Queries, run_id: str) -> list[dict]:
    """The cells of benchmark run ``run_id`` (its ``cells.json``; an older run without it: its
    child cell runs)."""
    with tempfile.TemporaryDirectory(prefix="nllab-compare-") as tmp:
        try:
            path = queries.download(run_id, CELLS_ARTIFACT, tmp)
            return json.loads(Path(path).read_text())
        except Exception:  # an older benchmark: its own child runs only
            pass
    cells = []
    for r in queries.child_runs(run_id):
        tags = r.tags
        if r.kind != "cell" or not r.finished:
            continue
        cells.append(
            {
                "system": tags.get(RunTags.SYSTEM),
                "method": tags.get(RunTags.METHOD),
                "seed": int(tags.get(RunTags.SEED, 0)),
                "status": "finished",
                Metrics.TEST_RMSE: r.metrics.get(Metrics.TEST_RMSE),
                "run_id": r.run_id,
            }
        )
    return cells


def _fingerprints(queries: Queries, cells: Sequence[dict]) -> dict[str, tuple[str, str] | None]:
    runs = queries.runs_by_id(c["run_id"] for c in cells if c.get("run_id"))
    return {run_id: run.numerics for run_id, run in runs.items()}


def _key(c: dict) -> str:
    return f"{c['system']}/{c['method']}/seed{c['seed']}"


def _ok(c: dict | None) -> float | None:
    if c is None or c.get("status") not in ("finished", "reused"):
        return None
    v = c.get(Metrics.TEST_RMSE)
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _spreads(cells: Sequence[dict]) -> dict[tuple[str, str], float]:
    groups: dict[tuple[str, str], list[float]] = {}
    for c in cells:
        if (v := _ok(c)) is not None:
            groups.setdefault((c["system"], c["method"]), []).append(v)
    return {k: float(np.std(v)) for k, v in groups.items()}


def _changed(before: tuple[str, str] | None, after: tuple[str, str] | None) -> str:
    if before is None or after is None:
        return "not recorded"
    names = [n for n, b, a in zip(("model", "data set"), before, after, strict=True) if b != a]
    return ", ".join(names)


def _verdict(before: float | None, after: float | None, spread: float) -> str:
    if before is None and after is None:
        return "unchanged"
    if after is None:
        return "regressed"  # failed now
    if before is None:
        return "improved"  # failed before
    if before == after:
        return "unchanged"
    if abs(after - before) <= spread:
        return "within spread"
    return "regressed" if after > before else "improved"


def compare_benchmarks(
    queries: Queries, run_id: str | None = None, against: str | None = None
) -> Comparison:
    """Benchmark ``run_id`` (default: the latest finished one) beside ``against`` (default: the
    finished benchmark of the same experiment before it). :class:`NoComparison` when either
    is missing."""
    after_run, against = _pair(queries, run_id, against)
    run_id = after_run.run_id
    after, before = _cells_of(queries, run_id), _cells_of(queries, against)
    prints = _fingerprints(queries, [*after, *before])
    spreads = _spreads(before)
    old = {_key(c): c for c in before}
    new = {_key(c): c for c in after}
    changes = [
        _change(key, old.get(key), new.get(key), spreads, prints)
        for key in [*new, *(k for k in old if k not in new)]
    ]
    profile = after_run.profile or "?"
    return Comparison(run_id, against, profile, tuple(changes))


def _pair(queries: Queries, run_id: str | None, against: str | None):
    """The finished benchmark run ``run_id`` (default: the latest) and the id of the one it is
    compared with (default: the same experiment's finished benchmark before it)."""
    runs = queries.finished_runs("benchmark")  # newest first
    by_id = {r.run_id: r for r in runs}
    if run_id is None:
        if not runs:
            raise NoComparison(f"no finished benchmark in {queries.settings.tracking_uri}")
        run_id = runs[0].run_id
    if run_id not in by_id:
        raise UnknownRun(f"{run_id} is not a finished benchmark run")
    after_run = by_id[run_id]
    experiment = after_run.experiment_hash
    if against is None:
        older = [
            r
            for r in runs
            if r.start_time < after_run.start_time
            and experiment is not None
            and r.experiment_hash == experiment
        ]
        if not older:
            raise NoComparison(
                f"no earlier finished benchmark of the same experiment as {run_id} to compare with"
            )
        against = older[0].run_id
    elif against not in by_id:
        raise UnknownRun(f"{against} is not a finished benchmark run")
    return after_run, against


def _change(key, b: dict | None, a: dict | None, spreads: dict, prints: dict) -> CellChange:
    """One cell before (``b``) and after (``a``; either may be missing) as a verdict."""
    c = a or b
    assert c is not None
    spread = spreads.get((c["system"], c["method"]), 0.0)
    if b is None or a is None:
        verdict: str = "new" if b is None else "gone"
        changed = ""
    else:
        same_run = a.get("run_id") == b.get("run_id")
        changed = (
            "" if same_run else _changed(prints.get(b.get("run_id")), prints.get(a.get("run_id")))
        )
        verdict = _verdict(_ok(b), _ok(a), spread)
    return CellChange(
        key,
        c["system"],
        c["method"],
        _ok(b),
        _ok(a),
        spread,
        changed,
        verdict,  # type: ignore[arg-type]
    )


def record_comparison(tracking: Tracking, run_id: str) -> Comparison | None:
    """Compare benchmark ``run_id`` with the previous one of its experiment and record it: on
    the run (the ``regressions`` metric, ``comparison.md``) and as the Prefect artifacts of
    the current flow run (the comparison as a table and as Markdown, keyed by profile).
    ``None`` (and a ``comparison.md`` saying so) when there is nothing to compare with."""
    from flows._artifacts import artifact_key, publish_markdown, publish_table

    try:
        comparison: Comparison | None = compare_benchmarks(tracking.queries, run_id)
    except NoComparison as e:
        comparison, text, profile = None, f"# Nothing to compare\n\n{e}\n", None
    else:
        text, profile = comparison.to_markdown(), comparison.profile
    profile = profile or tracking.queries.get_run_data(run_id).profile or "run"
    tracking.runs.log_text(run_id, text, "comparison.md")
    regressions = comparison.regressions if comparison is not None else 0
    tracking.runs.log_metrics(run_id, {Metrics.REGRESSIONS: regressions})
    key = artifact_key("benchmark", profile, "comparison")
    if comparison is not None:
        publish_table(key + "-table", comparison.rows(), comparison.summary())
    publish_markdown(key, text, f"Benchmark {profile} against the previous one (run {run_id})")
    return comparison
