"""Study tables: mean ± std over seeds beside the paper's figure, with a verdict.

Every study table has the study's key columns followed by :data:`VALUE_COLUMNS`: the mean over
seeds (``value``), its ``std`` and ``n``, the paper's figure (``paper``), the difference
(``gap = value − paper``) and a ``verdict`` (``better``, ``match`` within 10 %, ``worse``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tasks.results import CellResult

__all__ = [
    "MATCH_TOLERANCE",
    "VALUE_COLUMNS",
    "add_paper",
    "aggregate",
    "rmse_records",
    "to_markdown",
    "verdict",
]

VALUE_COLUMNS: tuple[str, ...] = ("value", "std", "n", "paper", "gap", "verdict")
#: Relative distance to the paper's figure that still counts as a match.
MATCH_TOLERANCE = 0.10


def aggregate(records: Iterable[Mapping[str, Any]], keys: Sequence[str]) -> pd.DataFrame:
    """Mean/std/n over seeds of ``value`` per key (NaN values count as missing).

    Population std, as the main table. Row order follows first appearance.
    """
    rows: dict[tuple, list[float]] = {}
    for r in records:
        k = tuple(r[c] for c in keys)
        v = r.get("value")
        rows.setdefault(k, [])
        if v is not None and np.isfinite(v):
            rows[k].append(float(v))
    out = []
    for k, vals in rows.items():
        a = np.asarray(vals, dtype=float)
        out.append(
            {
                **dict(zip(keys, k)),
                "value": float(a.mean()) if a.size else math.nan,
                "std": float(a.std()) if a.size else math.nan,
                "n": int(a.size),
            }
        )
    return pd.DataFrame(out, columns=[*keys, "value", "std", "n"])


def add_paper(
    frame: pd.DataFrame,
    keys: Sequence[str],
    paper: Mapping[tuple[str, ...], float],
    *,
    higher_is_better: bool = False,
    tolerance: float = MATCH_TOLERANCE,
) -> pd.DataFrame:
    """Add ``paper``, ``gap`` (ours − paper) and ``verdict`` columns."""
    out = frame.copy()
    pub = [paper.get(tuple(str(row[k]) for k in keys), math.nan) for _, row in out.iterrows()]
    out["paper"] = np.asarray(pub, dtype=float)
    out["gap"] = out["value"] - out["paper"]
    out["verdict"] = [
        verdict(v, p, higher_is_better, tolerance)
        for v, p in zip(out["value"], out["paper"], strict=True)
    ]
    return out


def verdict(value: float, paper: float, higher_is_better: bool, tolerance: float) -> str:
    """``better``/``match``/``worse`` against the paper; ``–`` without a figure or a value."""
    if not (np.isfinite(value) and np.isfinite(paper)):
        return "–"
    if abs(value - paper) <= tolerance * abs(paper):
        return "match"
    return "better" if (value > paper) == higher_is_better else "worse"


def rmse_records(
    results: Sequence[CellResult], labels: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per-seed rows ``{**label, value: test RMSE}`` for results and their key labels."""
    return [
        {**lab, "value": r.test_rmse if r.ok else math.nan}
        for r, lab in zip(results, labels, strict=True)
    ]


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table, numbers with 4 significant digits, verdicts marked."""
    from tasks.tables import Table, render_table

    return render_table(Table.from_frame(frame), "markdown")
