"""Reports over the tracking store: ``nllab report`` (:mod:`.report_full`, writing only the files
its manifest owns: :mod:`._report_folder`) and benchmarks over time, a benchmark beside the
earlier one of the same cells (:mod:`.compare`; the verdicts are
:mod:`tasks.reports.comparison`'s).

Names load on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlmodels.lazy import lazy_face

if TYPE_CHECKING:
    from flows.reports.compare import (
        CELLS_ARTIFACT,
        UnknownRun,
        benchmark_of,
        cells_hash,
        cells_record,
        compare_benchmarks,
        comparison_rows,
        comparison_section,
        comparison_summary,
        describe_run,
        record_comparison,
    )
    from flows.reports.report_full import (
        UnownedFiles,
        benchmark_config,
        build_report,
        stored_cell_results,
    )

_LAZY = {
    "build_report": "report_full",
    "benchmark_config": "report_full",
    "stored_cell_results": "report_full",
    "UnownedFiles": "report_full",
    "CELLS_ARTIFACT": "compare",
    "UnknownRun": "compare",
    "benchmark_of": "compare",
    "cells_hash": "compare",
    "cells_record": "compare",
    "comparison_rows": "compare",
    "comparison_section": "compare",
    "comparison_summary": "compare",
    "describe_run": "compare",
    "record_comparison": "compare",
    "compare_benchmarks": "compare",
}

__all__ = [
    "CELLS_ARTIFACT",
    "UnknownRun",
    "UnownedFiles",
    "benchmark_config",
    "benchmark_of",
    "build_report",
    "cells_hash",
    "cells_record",
    "compare_benchmarks",
    "comparison_rows",
    "comparison_section",
    "comparison_summary",
    "describe_run",
    "record_comparison",
    "stored_cell_results",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
