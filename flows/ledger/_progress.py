"""Where a ledger's cells stand while they train: ``nllab ledger status --training`` asks once,
``nllab ledger run`` says it every few minutes (a full-budget pack reports its cells only when
it ends, hours later), both from the tracking store's runs
(:func:`tasks.ledger.views.cell_progress`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.ledger import CellProgress, LedgerCell, cell_progress, paper_config
from tasks.tracking.tags import Metrics, RunTags

if TYPE_CHECKING:
    from tasks.tracking import Queries

__all__ = ["ProgressReports", "progress_of", "training_now"]


def progress_of(queries: Queries, cells: Sequence[LedgerCell]) -> list[CellProgress]:
    """Each of ``cells`` that the store of ``queries`` is training now, in ``cells``' order."""
    by_hash = {c.config_hash: c for c in cells}
    order = {c.key: i for i, c in enumerate(cells)}
    progress = [
        cell_progress(
            by_hash[h],
            run.run_id,
            dict(run.params),
            queries.metric_times(run.run_id, Metrics.TRAIN_LOSS),
            _resumed_at(run.tags),
        )
        for h, run in queries.running_cells(by_hash).items()
    ]
    return sorted(progress, key=lambda p: order[p.cell.key])


def _resumed_at(tags: Mapping[str, str]) -> int | None:
    try:
        return int(tags[RunTags.RESUMED_AT_EPOCH])
    except (KeyError, ValueError):
        return None


def training_now(
    cells: Sequence[LedgerCell], *, config_file: str | Path | None = None
) -> tuple[list[CellProgress], str]:
    """Which of ``cells`` the ledger's tracking store (the one ``ledger run`` writes) is
    training now, with their progress, and the store's address. Opening the store ends the
    runs of processes that are gone."""
    from tasks.tracking import connect

    queries = connect(paper_config(config_file=config_file).tracking).queries
    return progress_of(queries, cells), queries.settings.tracking_uri


class ProgressReports:
    """While open, says every ``seconds`` where the running ones of ``cells`` stand
    (:func:`flows.ledger.text.training_text`), from a background thread; nothing where none
    runs, or where the store does not answer (the next report tries again)."""

    def __init__(
        self,
        queries: Queries,
        cells: Sequence[LedgerCell],
        say: Callable[[str], None],
        seconds: float | None,
    ) -> None:
        self.queries, self.cells, self.say, self.seconds = queries, list(cells), say, seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="nllab-ledger-progress", daemon=True
        )

    def _loop(self) -> None:
        from flows.ledger.text import training_text

        assert self.seconds is not None
        while not self._stop.wait(self.seconds):
            try:
                progress = progress_of(self.queries, self.cells)
            except Exception:  # a busy or briefly unreachable store: the next report tries again
                continue
            if progress and not self._stop.is_set():
                for line in training_text(
                    progress, self.queries.settings.tracking_uri
                ).splitlines():
                    self.say(f"ledger: {line}")

    def __enter__(self) -> ProgressReports:
        if self.seconds:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
