"""Reports over the tracking store: ``nllab report`` (:mod:`.report_full`, writing only the files
its manifest owns: :mod:`._report_folder`) and benchmarks over time, a benchmark beside the
earlier one of the same cells (:mod:`.compare`; the verdicts are
:mod:`tasks.reports.comparison`'s).

Names load on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
