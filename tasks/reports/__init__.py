"""Report tables and the records they are made of: one table model and its renderers
(:mod:`.tables`), the verdict of ours against a published figure (:mod:`.verdict`), the results
table beside the paper's (:mod:`.reporting`), two benchmarks side by side
(:mod:`.comparison`), the per-run figures (:mod:`.plots`) and the benchmark scripts'
committed measurements (:mod:`.measurements`).

Plain functions over results and records: no store, no Prefect. Names load on first use
(PEP 562), so a caller that wants a table does not load matplotlib.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlmodels.lazy import lazy_face

if TYPE_CHECKING:
    from tasks.reports.comparison import ROUNDING, RTOL, Comparison, compare_cells
    from tasks.reports.measurements import (
        measurement_markdown,
        read_measurement,
        record_measurement,
    )
    from tasks.reports.plots import plot_extrapolation, plot_loss_curves
    from tasks.reports.reporting import (
        PAPER_BUDGET,
        PAPER_MAIN_TABLE,
        PAPER_STEREOGRAPHIC,
        TOP_SHARE_FLAG,
        Published,
        ResultsTable,
        parent_summary,
        results_table,
    )
    from tasks.reports.tables import (
        VERDICT_MARKS,
        Format,
        Table,
        TableCell,
        number,
        plural,
        render_table,
    )
    from tasks.reports.verdict import VERDICT_RULE, Verdict, t_test_p_value

_LAZY = {
    "Table": "tables",
    "TableCell": "tables",
    "Format": "tables",
    "number": "tables",
    "plural": "tables",
    "render_table": "tables",
    "VERDICT_MARKS": "tables",
    "VERDICT_RULE": "verdict",
    "Verdict": "verdict",
    "t_test_p_value": "verdict",
    "PAPER_MAIN_TABLE": "reporting",
    "PAPER_BUDGET": "reporting",
    "PAPER_STEREOGRAPHIC": "reporting",
    "Published": "reporting",
    "ResultsTable": "reporting",
    "results_table": "reporting",
    "parent_summary": "reporting",
    "TOP_SHARE_FLAG": "reporting",
    "Comparison": "comparison",
    "compare_cells": "comparison",
    "ROUNDING": "comparison",
    "RTOL": "comparison",
    "plot_extrapolation": "plots",
    "plot_loss_curves": "plots",
    "measurement_markdown": "measurements",
    "read_measurement": "measurements",
    "record_measurement": "measurements",
}

__all__ = [
    "PAPER_BUDGET",
    "PAPER_MAIN_TABLE",
    "PAPER_STEREOGRAPHIC",
    "ROUNDING",
    "RTOL",
    "TOP_SHARE_FLAG",
    "VERDICT_MARKS",
    "VERDICT_RULE",
    "Comparison",
    "Format",
    "Published",
    "ResultsTable",
    "Table",
    "TableCell",
    "Verdict",
    "compare_cells",
    "measurement_markdown",
    "number",
    "parent_summary",
    "plot_extrapolation",
    "plot_loss_curves",
    "plural",
    "read_measurement",
    "record_measurement",
    "render_table",
    "results_table",
    "t_test_p_value",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
