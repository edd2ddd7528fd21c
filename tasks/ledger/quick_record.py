"""A recorded benchmark run, kept in the repository (``results/quick/PROFILE.json``), so that the
figures the README and the documentation show come from a committed record, never typed by hand.

The paper profile's cells accumulate in the ledger (:mod:`tasks.ledger`); a quick (or smoke)
benchmark is one command, so its record is one file: the run (profile, commit, the command's
wall time and the seconds in the flow, how many cells it trained and how many it reused from
the store, the machine) and one line per cell (system, method, seed, test RMSE, config hash,
commit, numerics fingerprints, device, hardware, training seconds, epochs, run id).
``nllab benchmark --record FILE`` writes it from the finished cells' runs in the tracking
store. Only the standard library (and :mod:`tasks.tracking.tags`) loads here.
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.tracking.tags import Metrics, RunTags

if TYPE_CHECKING:
    from tasks.config import CellConfig, RunConfig
    from tasks.tracking import Queries, RunRecord

__all__ = [
    "QUICK_RECORDS",
    "QuickCell",
    "QuickRun",
    "RecordError",
    "commits",
    "machine_name",
    "quick_cell",
    "quick_cells",
    "read_quick_run",
    "record_benchmark",
    "write_quick_run",
]

#: Where the repository keeps its recorded runs, one file per profile (``quick.json``, …).
QUICK_RECORDS = Path(__file__).resolve().parents[2] / "results" / "quick"


class RecordError(ValueError):
    """A record file that cannot be read as a recorded run (the message names the file)."""


@dataclass(frozen=True)
class QuickCell:
    """One finished cell of a recorded run (the field names are the file's keys).

    ``status``/``ok``/``top_share``/``rmse_without_top``/``diverged`` make it usable wherever a
    :class:`tasks.results.CellResult` is aggregated
    (:func:`tasks.reports.reporting.results_table`)."""

    system: str
    method: str
    seed: int
    test_rmse: float
    config_hash: str
    commit: str | None
    numerics: str | None
    device: str | None
    hardware: str | None
    train_seconds: float | None
    epochs: int | None
    run_id: str | None
    top_share: float | None = None
    rmse_without_top: float | None = None

    status = "finished"
    ok = True
    diverged = None


@dataclass(frozen=True)
class QuickRun:
    """A recorded benchmark: how it ran and its cells."""

    profile: str
    commit: str | None
    parent_run_id: str | None
    wall_seconds: float  # the command, from start to the printed table (the user's wait)
    flow_seconds: float  # the part in the Prefect flow (0 when every cell was reused)
    cells_trained: int
    cells_reused: int
    machine: str
    date: str  # the day it was recorded (UTC), for the reader; no result depends on it
    cells: tuple[QuickCell, ...]
    #: the machine's 1, 5 and 15-minute load averages as the run ended (the 15-minute one spans
    #: most of a quick run): how busy the machine was; None in records made before it was kept
    load: str | None = None

    def trained_where(self) -> str:
        """``54 cells trained at commit `…` on <machine>``; where some cells were trained again
        elsewhere (a model's cells replaced after its code changed), each commit and processor
        with its count of cells."""
        where = Counter((c.commit, c.hardware) for c in self.cells)
        if len(where) <= 1:
            at = ", ".join(f"`{c[:10]}`" for c in commits(self.cells)) or "an unknown commit"
            return f"{len(self.cells)} cells trained at commit {at} on {self.machine}"
        parts = [
            f"{n} at commit `{(commit or 'unknown')[:10]}` on {hardware or 'an unknown processor'}"
            for (commit, hardware), n in where.items()
        ]
        where_text = "; ".join(parts)
        return f"{len(self.cells)} cells trained ({where_text}), the command on {self.machine}"

    def to_json(self) -> str:
        """The file's text: the run's fields, then one line per cell (diffs stay readable)."""
        head = {k: v for k, v in asdict(self).items() if k != "cells"}
        lines = [json.dumps(asdict(c), ensure_ascii=False) for c in self.cells]
        body = ",\n    ".join(lines)
        text = json.dumps(head, ensure_ascii=False, indent=2)[:-2]
        return f'{text},\n  "cells": [\n    {body}\n  ]\n}}\n'


def _cell(data: Any) -> QuickCell:
    if not isinstance(data, Mapping):
        raise ValueError("a cell is a JSON object")
    names = {f.name for f in fields(QuickCell)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown cell field(s) {', '.join(unknown)}")
    v = data.get("test_rmse")
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"test_rmse must be a finite number, got {v!r}")
    try:
        return QuickCell(**data)
    except TypeError as e:  # a missing field
        raise ValueError(str(e).split(".", 1)[-1].strip()) from None


def read_quick_run(path: str | Path) -> QuickRun:
    """The recorded run in ``path``; :class:`RecordError` naming the file and the problem."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
            raise ValueError("a recorded run is a JSON object with a 'cells' list")
        cells = tuple(_cell(c) for c in data["cells"])
        head = {k: v for k, v in data.items() if k != "cells"}
        return QuickRun(**head, cells=cells)
    except (OSError, ValueError, TypeError) as e:  # JSONDecodeError is a ValueError
        raise RecordError(f"{path}: not a recorded run: {e}") from None


def write_quick_run(path: str | Path, run: QuickRun) -> Path:
    """Write ``run`` to ``path`` (replacing an earlier record of it), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(run.to_json(), encoding="utf-8")
    os.replace(tmp, path)
    return path


def machine_name() -> str:
    """The processor model and the number of cores this process may use."""
    from tasks.ledger.provenance import hardware_name
    from tasks.machine import usable_cores

    cores = usable_cores()
    return f"{hardware_name('cpu')}, {cores} cores, {platform.system()} {platform.machine()}"


def _finite(metrics: Mapping[str, float], name: str) -> float | None:
    v = metrics.get(name)
    return None if v is None or not math.isfinite(v) else float(v)


def quick_cell(cell: CellConfig, record: RunRecord) -> QuickCell:
    """The record of ``cell`` from its finished run in the store."""
    from tasks.ledger.provenance import hardware_name, numerics_of

    m, tags = record.metrics, record.tags
    test = _finite(m, Metrics.TEST_RMSE)
    if test is None:
        raise ValueError(f"run {record.run_id} of {cell.key} has no finite test_rmse")
    epochs = _finite(m, Metrics.EPOCHS_RUN)
    return QuickCell(
        system=cell.system,
        method=cell.method,
        seed=cell.seed,
        test_rmse=test,
        config_hash=cell.config_hash(),
        commit=tags.get(RunTags.GIT_COMMIT) or None,
        numerics=numerics_of(
            tags.get(RunTags.NUMERICS_MODEL),
            tags.get(RunTags.NUMERICS_SYSTEM),
            tags.get(RunTags.NUMERICS_DEVICE),
        ),
        device=tags.get("device_used") or None,
        hardware=hardware_name(tags.get("device_used") or "cpu"),
        train_seconds=_finite(m, Metrics.TRAIN_SECONDS),
        epochs=None if epochs is None else int(epochs),
        run_id=record.run_id,
        top_share=_finite(m, "test_top_share"),
        rmse_without_top=_finite(m, Metrics.TEST_RMSE_WITHOUT_TOP),
    )


def quick_cells(
    cells: Sequence[CellConfig], found: Mapping[str, RunRecord]
) -> tuple[QuickCell, ...]:
    """The records of ``cells`` that have a finished run in ``found`` (by config hash), in
    the order of ``cells``."""
    return tuple(
        quick_cell(c, found[h])
        for c in cells
        if (h := c.config_hash()) in found and found[h].test_rmse is not None
    )


def commits(cells: Iterable[QuickCell]) -> tuple[str, ...]:
    """The distinct commits the cells were trained at, in first-seen order."""
    return tuple(dict.fromkeys(c.commit for c in cells if c.commit))


def record_benchmark(
    path: str | Path,
    config: RunConfig,
    queries: Queries,
    *,
    parent_run_id: str | None,
    wall_seconds: float,
    flow_seconds: float,
    cells_trained: int,
    cells_reused: int,
) -> QuickRun:
    """Record the finished benchmark of ``config`` in ``path``: each of its cells from its
    finished run in the store (``queries``), the run's seconds and counts as the command saw
    them. A cell without a finished run is left out (the record says how many it holds)."""
    import datetime

    from tasks.tracking import git_commit

    cells = config.cells()
    found = queries.finished_cells(c.config_hash() for c in cells)
    run = QuickRun(
        profile=config.profile,
        commit=git_commit(),
        parent_run_id=parent_run_id,
        wall_seconds=round(float(wall_seconds), 1),
        flow_seconds=round(float(flow_seconds), 1),
        cells_trained=int(cells_trained),
        cells_reused=int(cells_reused),
        machine=machine_name(),
        date=datetime.datetime.now(datetime.UTC).date().isoformat(),
        cells=quick_cells(cells, found),
        load=", ".join(f"{x:.1f}" for x in os.getloadavg()),
    )
    write_quick_run(path, run)
    return run
