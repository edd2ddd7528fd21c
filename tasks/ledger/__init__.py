"""The results kept in the repository: the ledger of the paper's budget (one JSON line per finished
full-budget cell, ``results/paper/ledger.jsonl``) and the quick records (``results/quick/``).

- :mod:`.measured`: what a study measured of a trained model (numbers and short curves), as a
  record keeps it;
- :mod:`.provenance`: where and under which numerics a record was made (the processor's name,
  the model's and data set's numerics fingerprints);
- :mod:`.records`: a ledger record, its file (read, append under a lock) and the cell types
  (:class:`LedgerCell`, :class:`LedgerScope`) every other module of the room builds on;
- :mod:`.scope`: which cells the ledger holds under today's code (Table 3 and its ablations),
  cached per code state;
- :mod:`.views`: what the records say about those cells (one counting rule, one verdict),
  shared by ``nllab ledger status``, ``table`` and ``run``;
- :mod:`.quick_record`: a recorded quick (or smoke) benchmark run.

The modules import one another in that order only (measured, provenance, records, scope,
views); the flows that train and print the ledger are :mod:`flows.ledger`'s. Names load on first
use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.ledger.provenance import cell_numerics, computed_on_gpu, hardware_name, numerics_of
    from tasks.ledger.quick_record import read_quick_run, record_benchmark
    from tasks.ledger.records import (
        ABLATIONS,
        DEFAULT_LEDGER,
        PEERS,
        LedgerCell,
        LedgerError,
        LedgerRecord,
        LedgerScope,
        append_records,
        read_ledger,
        record_of_run,
    )
    from tasks.ledger.scope import (
        LEDGER_PROFILES,
        ledger_cell_configs,
        ledger_scope,
        paper_config,
        scope_of,
    )
    from tasks.ledger.views import (
        CellProgress,
        CellState,
        LedgerStatus,
        ablation_table,
        best_per_system,
        cell_progress,
        cell_states,
        ledger_status,
        ledger_table,
    )

_LAZY = {
    "DEFAULT_LEDGER": "records",
    "PEERS": "records",
    "LedgerError": "records",
    "LedgerRecord": "records",
    "append_records": "records",
    "cell_numerics": "provenance",
    "computed_on_gpu": "provenance",
    "hardware_name": "provenance",
    "numerics_of": "provenance",
    "read_ledger": "records",
    "record_of_run": "records",
    "ABLATIONS": "records",
    "LedgerCell": "records",
    "LedgerScope": "records",
    "LEDGER_PROFILES": "scope",
    "ledger_cell_configs": "scope",
    "ledger_scope": "scope",
    "paper_config": "scope",
    "scope_of": "scope",
    "CellProgress": "views",
    "CellState": "views",
    "LedgerStatus": "views",
    "ablation_table": "views",
    "best_per_system": "views",
    "cell_progress": "views",
    "cell_states": "views",
    "ledger_status": "views",
    "ledger_table": "views",
    "record_benchmark": "quick_record",
    "read_quick_run": "quick_record",
}

__all__ = [
    "ABLATIONS",
    "DEFAULT_LEDGER",
    "LEDGER_PROFILES",
    "PEERS",
    "CellProgress",
    "CellState",
    "LedgerCell",
    "LedgerError",
    "LedgerRecord",
    "LedgerScope",
    "LedgerStatus",
    "ablation_table",
    "append_records",
    "best_per_system",
    "cell_numerics",
    "cell_progress",
    "cell_states",
    "computed_on_gpu",
    "hardware_name",
    "ledger_cell_configs",
    "ledger_scope",
    "ledger_status",
    "ledger_table",
    "numerics_of",
    "paper_config",
    "read_ledger",
    "read_quick_run",
    "record_benchmark",
    "record_of_run",
    "scope_of",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
