"""The results ledger's flows: what is left to train and how it is grouped (:mod:`.plan`), how
much of it fits a time limit (:mod:`._budget`), training it through the benchmark and
recording each finished cell (:mod:`.run`, with :mod:`._progress` saying where the running
cells stand), how long the rest would take (:mod:`.forecast`), and the ledger's text:
``nllab ledger status``, ``table`` and the README's and documentation's generated blocks
(:mod:`.text`; the paper's other tables: :mod:`.study_text`).

The ledger's records, cells and views are :mod:`tasks.ledger`'s. Each module imports only those
before it: ``groups`` (:class:`LedgerGroup`, the type they share), ``_budget``, ``plan``,
``forecast``, ``study_text``, ``text``, ``_progress``, ``run``. Names load on first use (PEP
562), so ``nllab ledger status`` loads neither Prefect nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlmodels.lazy import lazy_face

if TYPE_CHECKING:
    from flows.ledger._budget import (
        ESTIMATE_MARGIN,
        FIXED_SECONDS,
        RECENT_RECORDS,
        expected_seconds,
        fitting_parts,
        speed_ratios,
    )
    from flows.ledger._progress import training_now
    from flows.ledger.forecast import Forecast
    from flows.ledger.groups import LedgerGroup
    from flows.ledger.plan import (
        cpu_workers,
        group_config,
        ledger_groups,
        ledger_states,
        projected_cell_seconds,
        recorded_seconds,
        solver_factors,
        to_train,
    )
    from flows.ledger.run import REPORT_SECONDS, LedgerRun, record_store, run_ledger
    from flows.ledger.text import (
        forecast_text,
        ledger_markdown,
        protocols_markdown,
        readme_ledger,
        status_text,
        tables,
        training_text,
    )

_LAZY = {
    "run_ledger": "run",
    "record_store": "run",
    "REPORT_SECONDS": "run",
    "LedgerRun": "run",
    "training_now": "_progress",
    "LedgerGroup": "groups",
    "to_train": "plan",
    "ledger_groups": "plan",
    "ledger_states": "plan",
    "group_config": "plan",
    "projected_cell_seconds": "plan",
    "recorded_seconds": "plan",
    "solver_factors": "plan",
    "cpu_workers": "plan",
    "Forecast": "forecast",
    "checkpoint_folder": "run",
    "status_text": "text",
    "training_text": "text",
    "forecast_text": "text",
    "ledger_markdown": "text",
    "tables": "text",
    "readme_ledger": "text",
    "protocols_markdown": "text",
    "FIXED_SECONDS": "_budget",
    "ESTIMATE_MARGIN": "_budget",
    "RECENT_RECORDS": "_budget",
    "expected_seconds": "_budget",
    "speed_ratios": "_budget",
    "fitting_parts": "_budget",
}

__all__ = [
    "ESTIMATE_MARGIN",
    "FIXED_SECONDS",
    "RECENT_RECORDS",
    "REPORT_SECONDS",
    "Forecast",
    "LedgerGroup",
    "LedgerRun",
    "checkpoint_folder",
    "cpu_workers",
    "expected_seconds",
    "fitting_parts",
    "forecast_text",
    "group_config",
    "ledger_groups",
    "ledger_markdown",
    "ledger_states",
    "projected_cell_seconds",
    "protocols_markdown",
    "readme_ledger",
    "record_store",
    "recorded_seconds",
    "run_ledger",
    "solver_factors",
    "speed_ratios",
    "status_text",
    "tables",
    "to_train",
    "training_now",
    "training_text",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
