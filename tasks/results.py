"""The cell engine's result type: what became of one cell (finished, reused, failed, ...).

Every :class:`CellResult` is made by one of its three constructors, each from the cell's
config (so system, method, seed and config hash are never copied by hand):
:meth:`CellResult.fresh` (trained and evaluated here), :meth:`CellResult.reused` (a finished run
in the store) and :meth:`CellResult.failed` (failed, interrupted or missing, with why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tasks.tracking.tags import Metrics

if TYPE_CHECKING:
    from tasks.config import CellConfig
    from tasks.tracking import RunRecord

__all__ = ["CellResult", "CellStatus", "by_config_hash"]

CellStatus = Literal["finished", "reused", "failed", "interrupted", "missing"]


@dataclass(frozen=True)
class CellResult:
    """Outcome of one cell, as the engine returns it and the report needs it.

    ``top_share`` is the share of the test squared error carried by the worst few samples and
    ``rmse_without_top`` the test RMSE without them (``None`` when the run did not log them).
    """

    system: str
    method: str
    seed: int
    status: CellStatus
    test_rmse: float | None = None
    run_id: str | None = None
    config_hash: str | None = None
    error: str | None = None
    top_share: float | None = None
    rmse_without_top: float | None = None
    train_seconds: float | None = None  # the cell's own training time (its run's metric)
    #: the model never learned (its run's ``diverged`` metric is 1): what shows it, else ``None``
    diverged: str | None = None

    @property
    def key(self) -> str:
        return f"{self.system}/{self.method}/seed{self.seed}"

    @property
    def ok(self) -> bool:
        return self.status in ("finished", "reused") and self.test_rmse is not None

    @classmethod
    def fresh(cls, cell: CellConfig, run_id: str, metrics: Mapping[str, float]) -> CellResult:
        """A cell trained and evaluated here, from its run and its test metrics (``test_rmse``,
        ``test_top_share``, ``test_rmse_without_top``)."""
        return cls._of(cell, "finished", run_id, metrics, metrics.get(Metrics.TEST_RMSE))

    @classmethod
    def reused(cls, cell: CellConfig, record: RunRecord) -> CellResult:
        """A cell's finished run in the store (a :class:`tasks.tracking.RunRecord`)."""
        return cls._of(cell, "reused", record.run_id, record.metrics, record.test_rmse)

    @classmethod
    def recorded(
        cls, cell: CellConfig, run_id: str | None, metrics: Mapping[str, float], test_rmse: float
    ) -> CellResult:
        """A cell's result kept outside the store (the results ledger's record of it: its run's
        final ``metrics`` as the record holds them), as if reused."""
        return cls._of(cell, "reused", run_id or "", metrics, test_rmse)

    @classmethod
    def failed(
        cls,
        cell: CellConfig,
        status: Literal["failed", "interrupted", "missing"] = "failed",
        error: str | None = None,
    ) -> CellResult:
        """A cell without a result: ``failed`` or ``interrupted`` (``error`` says why), or
        ``missing`` (no finished run in the store)."""
        return cls(
            cell.system, cell.method, cell.seed, status, config_hash=cell.config_hash(), error=error
        )

    @classmethod
    def _of(
        cls,
        cell: CellConfig,
        status: CellStatus,
        run_id: str,
        metrics: Mapping[str, float],
        test_rmse: float | None,
    ) -> CellResult:
        return cls(
            cell.system,
            cell.method,
            cell.seed,
            status,
            test_rmse,
            run_id,
            cell.config_hash(),
            top_share=metrics.get("test_top_share"),
            rmse_without_top=metrics.get(Metrics.TEST_RMSE_WITHOUT_TOP),
            train_seconds=metrics.get(Metrics.TRAIN_SECONDS),
            diverged=_diverged(metrics, test_rmse),
        )


def by_config_hash(results: Iterable[CellResult]) -> dict[str, CellResult]:
    """``results`` by their cells' config hashes: results made from a cell (:meth:`CellResult.
    fresh`, :meth:`~CellResult.reused`, :meth:`~CellResult.failed`), which always carry one."""
    out: dict[str, CellResult] = {}
    for r in results:
        assert r.config_hash is not None, f"{r.key}: a result without its cell's config hash"
        out[r.config_hash] = r
    return out


def _diverged(metrics: Mapping[str, float], test_rmse: float | None) -> str | None:
    """What shows a diverged cell (its ``diverged`` metric is 1), else ``None``."""
    if not metrics.get(Metrics.DIVERGED):
        return None
    best = metrics.get(Metrics.BEST_EPOCH)
    epoch = f", best epoch {int(best)}" if best is not None else ""
    return f"test RMSE {test_rmse:.4g}{epoch}"
