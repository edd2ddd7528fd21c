"""The cell pipeline's pure core (steps that return values), its one logging edge, the result
constructors and the one answer to "is this cell done?"."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cells import tiny_cell

from nltrain import EpochRecord, TrainResult, predict
from tasks.cell import CellRuntime, run_cell, stored_results
from tasks.config import CellConfig
from tasks.pipeline import (
    CellOutcome,
    CellSetup,
    build_cell_model,
    evaluate_cell,
    log_outcome,
    prepare_cell,
    simulate_data,
)
from tasks.results import CellResult
from tasks.tracking import RunRecord, RunTags, connect

_cell = tiny_cell


def test_result_constructors_carry_the_cells_identity():
    cell = _cell(3, method="anode")
    failed = CellResult.failed(cell, "interrupted", "stopped")
    assert (failed.system, failed.method, failed.seed) == ("integro_de", "anode", 3)
    assert failed.config_hash == cell.config_hash() and failed.error == "stopped"
    assert failed.status == "interrupted" and not failed.ok and failed.test_rmse is None
    assert CellResult.failed(cell).status == "failed"
    missing = CellResult.failed(cell, "missing")
    assert missing.status == "missing" and missing.error is None

    metrics = {"test_rmse": 0.25, "test_top_share": 0.6, "test_rmse_without_top": 0.1}
    fresh = CellResult.fresh(cell, "run-1", metrics)
    assert fresh.status == "finished" and fresh.ok and fresh.key == "integro_de/anode/seed3"
    assert (fresh.test_rmse, fresh.top_share, fresh.rmse_without_top) == (0.25, 0.6, 0.1)
    assert fresh.run_id == "run-1" and fresh.config_hash == cell.config_hash()

    record = RunRecord("run-2", cell.config_hash(), 0.5, {}, {"test_top_share": 0.2})
    reused = CellResult.reused(cell, record)
    assert reused.status == "reused" and reused.run_id == "run-2" and reused.test_rmse == 0.5
    assert reused.top_share == 0.2 and reused.rmse_without_top is None
    assert reused.config_hash == cell.config_hash() and reused.seed == 3


def _setup(cell: CellConfig) -> CellSetup:
    ds = simulate_data(cell.system, cell.data, cell.seed)
    prepared = prepare_cell(cell, ds)
    model, args = build_cell_model(cell, int(ds.x.shape[-1]))
    return CellSetup(cell, ds, prepared, model, args)


def test_evaluate_cell_scores_the_model_as_a_hand_computation():
    cell = _cell(1)
    setup = _setup(cell)
    # the same initial weights from the same seed: building is a pure step
    again, _ = build_cell_model(cell, setup.state_dim)
    for a, b in zip(setup.model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    history = (EpochRecord(0, 1.0, 0.9, 0.8, 0.5, 10), EpochRecord(1, 0.7, 0.6, 0.55, 0.5, 10))
    setup.model.to(getattr(torch, cell.training.dtype))  # as training leaves it
    trained = TrainResult(history, best_epoch=1, best_val_rmse=0.55, stopped="epochs", seconds=1.0)
    test = setup.prepared.test
    pred = predict(setup.model, test, device=torch.device("cpu"), dtype=cell.training.dtype)
    target = np.asarray(test.target)
    want = float(np.sqrt(np.mean((pred - target) ** 2)))

    out = evaluate_cell(setup, trained, torch.device("cpu"), cell.config_hash())
    assert out.metrics["test_rmse"] == pytest.approx(want, rel=1e-10)
    assert out.metrics["test_rmse_dim0"] == pytest.approx(want, rel=1e-10)  # one dimension
    assert out.metrics["best_epoch"] == 1 and out.metrics["epochs_run"] == 2
    assert out.metrics["best_val_rmse"] == 0.55 and out.metrics["train_seconds"] == 1.0
    assert out.tags["stopped"] == "epochs" and out.tags["device_used"] == "cpu"
    assert set(out.figures) == {"loss_curves.png", "extrapolation.png"}
    assert all(data.startswith(b"\x89PNG") for data in out.figures.values())
    model, spec = out.model
    assert model is setup.model and spec.config_hash == cell.config_hash()
    assert spec.test_rmse == out.metrics["test_rmse"]


def test_log_outcome_logs_exactly_the_outcome(mlflow_store):
    t = connect()
    run = t.runs.create_run("logged", {RunTags.KIND: "cell"}, None)
    outcome = CellOutcome(
        params={"alpha": 3, "name": "x"},
        texts={"notes.txt": "hello"},
        tags={"stopped": "epochs"},
        figures={"a.png": b"\x89PNG-not-really"},
        metrics={"test_rmse": 0.125, "made_up_metric": 7.0},
    )
    log_outcome(t.runs, run, outcome)
    data = t.queries.get_run_data(run)
    assert data.metrics == {"test_rmse": 0.125, "made_up_metric": 7.0}
    assert data.params == {"alpha": "3", "name": "x"}
    assert data.tags["stopped"] == "epochs"
    files = {f.path for f in t.store.client.list_artifacts(run)}
    assert files == {"notes.txt", "plots"}
    assert [f.path for f in t.store.client.list_artifacts(run, "plots")] == ["plots/a.png"]


def test_stored_results_is_the_one_answer_to_is_this_cell_done(mlflow_store):
    t = connect()
    rt = CellRuntime.for_store(t.store, parent_run_id=None, profile="smoke", device="cpu")
    done, todo = _cell(2), _cell(3)
    trained = run_cell(done, rt)
    assert trained.status == "finished"
    reused, to_run = stored_results(t.queries, [todo, done])
    assert to_run == [todo]
    assert reused == [
        CellResult.reused(done, t.queries.finished_cells([done.config_hash()])[done.config_hash()])
    ]
    assert reused[0].run_id == trained.run_id and reused[0].test_rmse == trained.test_rmse
    assert reused[0].top_share == trained.top_share
