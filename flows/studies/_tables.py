"""Study tables: mean ± std over seeds beside the paper's figure, with a verdict.

Every study table has the study's key columns followed by :data:`VALUE_COLUMNS`: the mean over
seeds (``value``), its ``std`` and ``n``, the paper's figure (``paper``), the difference
(``gap = value − paper``) and a ``verdict`` (``better``, ``match``, ``worse``: the one rule of
:func:`tasks.reports.verdict.verdict`; the paper's study figures have no ±).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tasks.reports.verdict import verdict
from tasks.results import CellResult

__all__ = [
    "PAPER_ROWS",
    "VALUE_COLUMNS",
    "add_paper",
    "aggregate",
    "paper_rows",
    "rmse_records",
    "to_markdown",
]

VALUE_COLUMNS: tuple[str, ...] = ("value", "std", "n", "paper", "gap", "verdict")

#: The methods' rows in the paper's appendix tables (Tables 3, CMI, datascaling,
#: AdditionalNoiseResult, toywaveforms), top to bottom: a study's published figures are
#: transcribed in this order.
PAPER_ROWS: tuple[str, ...] = (
    "node",
    "anode",
    "latent_ode",
    "nf_coupling",
    "nf_resnet",
    "neural_laplace",
)


def paper_rows(
    columns: Mapping[tuple[str, ...], Sequence[float]],
) -> dict[tuple[str, ...], float]:
    """``{(*column, method): figure}`` from a paper table transcribed column by column, each
    column's figures in :data:`PAPER_ROWS` order."""
    return {
        (*key, m): v for key, row in columns.items() for m, v in zip(PAPER_ROWS, row, strict=True)
    }


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
                "std": float(a.std(ddof=1)) if a.size > 1 else math.nan,
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
    paper_keys: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Add ``paper``, ``gap`` (ours − paper) and ``verdict`` columns (``–`` without a figure or
    a value); ``std`` and ``n``, where the frame has them, are the spread the verdict tests.
    ``paper`` is keyed by the columns ``paper_keys`` (None: ``keys``), as strings."""
    out = frame.copy()
    by = tuple(paper_keys or keys)
    pub = [paper.get(tuple(str(row[k]) for k in by), math.nan) for _, row in out.iterrows()]
    out["paper"] = np.asarray(pub, dtype=float)
    out["gap"] = out["value"] - out["paper"]
    out["verdict"] = [
        verdict(
            row["value"],
            row.get("std"),
            int(row["n"]) if "n" in row and np.isfinite(row["n"]) else 1,
            row["paper"],
            higher_is_better=higher_is_better,
        )
        or "–"
        for _, row in out.iterrows()
    ]
    return out


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
    from tasks.reports import Table, render_table

    return render_table(Table.from_frame(frame), "markdown")
