"""Log the outlier census and the dominance scores onto finished cell runs that lack them.

Cells trained before ``tasks.cell`` logged them (or by an older checkout) get the same metrics
afterwards: ``outliers_10sigma_{split}_dim{d}``, ``test_top_share`` and ``test_rmse_without_top``.
Each run's data set is rebuilt from its ``config.json`` (read from the cache when it is there),
its saved model is reloaded and evaluated again; the recomputed test RMSE must equal the logged
one, else the run is left alone. With ``--per-trajectory DIR`` it also writes each run's
per-trajectory test RMSE (``DIR/<run id>.csv``), for looking at where the error sits.

    NLLAB_HOME=... python benchmarks/outlier_census.py [--runs ID ...] [--per-trajectory DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nltrain import evaluate, outlier_census
from tasks.cell import prepare_cell, simulate_data
from tasks.config import CellConfig
from tasks.modelio import load_model
from tasks.tracking import Metrics, Tracking, connect


def backfill(tracking: Tracking, run_id: str, per_trajectory: Path | None, force: bool) -> str:
    run = tracking.queries.get_run_data(run_id)
    if Metrics.TEST_RMSE not in run.metrics:
        return "no test_rmse (not finished)"
    if "test_top_share" in run.metrics and per_trajectory is None and not force:
        return "has the metrics already"
    with tempfile.TemporaryDirectory(prefix="nllab-census-") as tmp:
        cell = CellConfig.model_validate_json(
            tracking.queries.download(run_id, "config.json", tmp).read_text()
        )
        model, _ = load_model(tracking.queries.download(run_id, "model", tmp))
    prepared = prepare_cell(cell, simulate_data(cell.system, cell.data, cell.seed))
    ev, pred = evaluate(
        model,
        prepared.test,
        prepared.normaliser,
        dtype=cell.training.dtype,
        batch_size=cell.training.batch_size,
    )
    logged = run.metrics[Metrics.TEST_RMSE]
    if not np.isclose(ev.test_rmse, logged, rtol=1e-8, atol=0.0):
        return f"recomputed test RMSE {ev.test_rmse!r} != logged {logged!r}: left alone"
    if per_trajectory is not None:
        per_trajectory.mkdir(parents=True, exist_ok=True)
        err = (pred - np.asarray(prepared.test.target)) ** 2
        rows = np.column_stack(
            [prepared.test.index, np.sqrt(err.mean(axis=(1, 2))), np.sqrt(err.mean(axis=1))]
        )
        dims = ",".join(f"rmse_dim{d}" for d in range(err.shape[-1]))
        np.savetxt(
            per_trajectory / f"{run_id}.csv",
            rows,
            delimiter=",",
            header=f"trajectory,rmse,{dims}",
            comments="",
            fmt=["%d"] + ["%.10g"] * (rows.shape[1] - 1),
        )
    metrics = {
        **outlier_census(prepared),
        "test_top_share": ev.top_share,
        Metrics.TEST_RMSE_WITHOUT_TOP: ev.rmse_without_top,
    }
    tracking.runs.log_metrics(run_id, metrics)
    tracking.runs.set_tags(run_id, {"outlier_census": "backfilled"})
    return f"logged (top share {ev.top_share:.3f}, without top {ev.rmse_without_top:.4g})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="*", help="cell run ids (default: every finished cell run)")
    ap.add_argument("--per-trajectory", type=Path, help="write per-trajectory test RMSE here")
    ap.add_argument("--force", action="store_true", help="recompute runs that have the metrics")
    args = ap.parse_args()
    tracking = connect()
    runs = args.runs or [r.run_id for r in tracking.queries.finished_runs("cell")]
    for run_id in runs:
        print(run_id, backfill(tracking, run_id, args.per_trajectory, args.force), flush=True)


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
