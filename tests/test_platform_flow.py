"""The smoke benchmark end to end: Prefect flow, MLflow runs, registry, skipping and redoing."""

from __future__ import annotations

import sqlite3

import pytest

from datasets import load_or_simulate, prepare
from flows import registry_name, run_benchmark
from nlmodels import cpu_mode_in_effect, native_cpu_kernels
from nltrain import evaluate
from tasks import load_registered_model
from tasks.cell import CellRuntime, run_cell
from tasks.config import CellConfig, TrainConfig, resolve_config
from tasks.tracking import Tracking, connect

SYSTEMS = ["integro_de", "spiral_dde"]
METHODS = ["neural_laplace", "node"]


def _config(**over):
    base = {"systems": SYSTEMS, "methods": METHODS, "seeds": [0, 1], "progress": False}
    return resolve_config("smoke", overrides={**base, **over})


@pytest.fixture(scope="module")
def _first_run(module_mlflow_store, prefect_server):
    """The smoke benchmark, trained once per module, and the store it wrote."""
    return run_benchmark(_config()), module_mlflow_store


@pytest.fixture
def first(_first_run, tmp_path, point_mlflow_at):
    """The first benchmark's result, with this test pointed at a private copy of the store as
    that run left it: tests add runs, versions and failures, and none sees another's."""
    summary, store = _first_run
    copy = point_mlflow_at(tmp_path / "mlflow")
    source, dest = sqlite3.connect(store / "mlflow.db"), sqlite3.connect(copy / "mlflow.db")
    try:
        source.backup(dest)  # consistent even with a write-ahead log
    finally:
        source.close()
        dest.close()
    return summary


def _cell_runs(tracker: Tracking):
    return tracker.store.client.search_runs(
        [tracker.experiment_id], "tags.`nllab.kind` = 'cell'", max_results=1000
    )


def test_every_cell_finishes_with_a_result(first):
    assert first.ok and first.count("finished") == 8 and first.count("reused") == 0
    assert {r.key for r in first.results} == {c.key for c in _config().cells()}
    assert all(0 < r.test_rmse < 10 for r in first.results)
    assert set(first.table.frame["n_seeds"]) == {2}


def test_child_runs_hold_params_metrics_tags_artifacts(first):
    t = connect()
    parent = t.queries.get_run_data(first.parent_run_id)
    assert parent.status == "FINISHED"
    assert parent.tags["nllab.kind"] == "benchmark" and parent.tags["profile"] == "smoke"
    assert parent.tags["cells_failed"] == "0"
    parent_files = {f.path for f in t.store.client.list_artifacts(first.parent_run_id, "results")}
    assert parent_files == {"results/results.csv", "results/results.md", "results/results.tex"}
    children = t.queries.child_runs(first.parent_run_id)
    assert len(children) == 8
    hashes = {c.key: c.config_hash() for c in _config().cells()}
    for run in children:
        tags, params, metrics = run.tags, run.params, run.metrics
        key = f"{tags['system']}/{tags['method']}/seed{tags['seed']}"
        assert run.status == "FINISHED"
        assert tags["config_hash"] == hashes[key] and tags["profile"] == "smoke"
        assert len(tags["dataset_hash"]) == 64 and tags["mlflow.source.git.commit"]
        # which CPU path trained it: the native kernels serve float64 Neural Laplace only
        native = tags["method"] == "neural_laplace" and native_cpu_kernels()
        assert tags["native_cpu_kernels"] == str(native)
        # the run's CPU numerics mode (portable by default), whose kernels, MKL's strict mode
        cpu = cpu_mode_in_effect()
        kernels = "portable" if cpu.startswith("portable") else "torch"
        assert tags["numerics.cpu"] == cpu
        assert tags["numerics"].startswith(f"cpu={cpu}; kernels={kernels}; mkl_")
        assert "STRICT; position_independent=True;" in tags["numerics"]
        assert params["training.epochs"] == "2" and params["data.n_trajectories"] == "40"
        assert params["device"] == "auto" and int(params["n_parameters"]) > 100
        for name in ("train_loss", "val_loss", "val_rmse", "epoch_seconds", "nfe"):
            steps = [m.step for m in t.store.client.get_metric_history(run.run_id, name)]
            assert steps == [0, 1], name
        assert metrics["test_rmse"] == pytest.approx(
            next(r.test_rmse for r in first.results if r.run_id == run.run_id)
        )
        # the outlier census of every split and dimension, and the dominance scores
        dims = range(int(params["state_dim"]))
        census = {f"outliers_10sigma_{s}_dim{d}" for s in ("train", "val", "test") for d in dims}
        assert census <= set(metrics) and all(metrics[k] >= 0 for k in census)
        assert 0 < metrics["test_top_share"] <= 1
        assert metrics["test_rmse_without_top"] <= metrics["test_rmse"]
        files = {f.path for f in t.store.client.list_artifacts(run.run_id)}
        assert {"config.json", "plots"} <= files
        plots = {f.path for f in t.store.client.list_artifacts(run.run_id, "plots")}
        assert plots == {"plots/loss_curves.png", "plots/extrapolation.png"}
        # the model is the run's MLflow 3 logged model, with its own artifacts
        model_id = t.queries.logged_model_id(run.run_id)
        assert model_id is not None
        model = {f.path for f in t.store.client.list_logged_model_artifacts(model_id)}
        assert {"MLmodel", "pyfunc_model.py", "artifacts"} <= model
        weights = {
            f.path for f in t.store.client.list_logged_model_artifacts(model_id, "artifacts")
        }
        assert weights == {"artifacts/weights"}
        # the fully resolved constructor arguments, defaults included
        assert params["model.state_dim"] == params["state_dim"]
        if tags["method"] == "neural_laplace":
            assert params["model.terms"] == "33" and params["model.stereographic"] == "True"
        else:
            assert params["model.hidden"] == "[128, 128]" and params["model.solver"] == "euler"
        (ds,) = t.store.client.get_run(run.run_id).inputs.dataset_inputs  # MLflow's own view
        assert tags["dataset_hash"].startswith(ds.dataset.digest)
        # how it trained: NODE's two seeds as one packed model, Neural Laplace one by one
        assert tags["packed_members"] == ("2" if tags["method"] == "node" else "1")
        assert tags["device_used"] == "cpu" and tags["cuda_graphs"] == "False"


def test_registry_champion_is_the_best_neural_laplace(first):
    t = connect()
    for system in SYSTEMS:
        nl = [r for r in first.results if r.system == system and r.method == "neural_laplace"]
        best = min(nl, key=lambda r: r.test_rmse)
        _, run_id = t.registry.champion(registry_name(system))
        assert run_id == best.run_id
    # Loading the champion back gives a working model with the logged score.
    model, spec = load_registered_model(f"models:/{registry_name('integro_de')}@champion")
    cell = CellConfig.model_validate(spec.cell)
    ds = load_or_simulate("integro_de", n_trajectories=cell.data.n_trajectories, seed=cell.seed)
    assert ds.fingerprint == spec.dataset_fingerprint
    ev, _ = evaluate(
        model, prepare(ds, seed=cell.seed).test, prepare(ds, seed=cell.seed).normaliser
    )
    assert ev.test_rmse == pytest.approx(spec.test_rmse, abs=1e-9)


def test_second_run_skips_every_finished_cell(first):
    t = connect()
    n_before = len(_cell_runs(t))
    parents = "tags.`nllab.kind` = 'benchmark'"
    parents_before = len(t.store.client.search_runs([t.experiment_id], parents))
    versions_before = len(t.store.client.search_model_versions(""))
    again = run_benchmark(_config())
    assert again.count("reused") == 8 and again.count("finished") == 0
    assert len(_cell_runs(t)) == n_before
    # nothing to train: no new, empty parent run; the summary points at the one that trained them
    assert len(t.store.client.search_runs([t.experiment_id], parents)) == parents_before
    assert again.parent_run_id == first.parent_run_id
    assert len(t.store.client.search_model_versions("")) == versions_before
    by_key = {r.key: r.test_rmse for r in first.results}
    assert {r.key: r.test_rmse for r in again.results} == by_key


def test_interrupted_cell_is_redone(first):
    t = connect()
    new_cell = next(c for c in _config(seeds=[2]).cells() if c.method == "node")
    # A crash mid-cell leaves a RUNNING run (and a failed attempt a FAILED one) with the hash.
    stale = t.runs.create_run(
        "crashed", {"nllab.kind": "cell", "config_hash": new_cell.config_hash()}
    )
    failed = t.runs.create_run(
        "failed", {"nllab.kind": "cell", "config_hash": new_cell.config_hash()}
    )
    t.runs.end_run(failed, "FAILED")
    summary = run_benchmark(_config(seeds=[0, 1, 2], methods=["node"]))
    assert summary.count("reused") == 4 and summary.count("finished") == 2
    redone = next(r for r in summary.results if r.key == new_cell.key)
    assert redone.status == "finished" and redone.run_id not in (stale, failed)
    assert t.queries.get_run_data(stale).status == "RUNNING"  # nothing is rewritten


def test_failed_cell_is_recorded_and_others_finish(first, monkeypatch):
    # Settings that the model rejects only together: refused before anything starts ...
    import flows.benchmark
    from tasks.machine.model_memory import ModelRefused

    lowpass = {"stereographic": False, "max_frequency": 2.0}
    cfg = _config(systems=["integro_de"], seeds=[0], models={"neural_laplace": lowpass})
    n_runs = len(connect().store.client.search_runs([connect().experiment_id]))
    with pytest.raises(ModelRefused, match="neural_laplace on integro_de: max_frequency"):
        run_benchmark(cfg)
    assert len(connect().store.client.search_runs([connect().experiment_id])) == n_runs
    # ... and, that check skipped, a cell that fails mid-run (as a failure only training finds)
    monkeypatch.setattr(flows.benchmark, "check_models_fit", lambda cells, device: None)
    summary = run_benchmark(cfg)
    by_method = {r.method: r for r in summary.results}
    assert not summary.ok
    assert by_method["node"].ok  # unchanged config: reused
    bad = by_method["neural_laplace"]
    assert bad.status == "failed" and "max_frequency" in bad.error
    t = connect()
    (run,) = [
        r
        for r in t.queries.child_runs(summary.parent_run_id)
        if r.tags["method"] == "neural_laplace"
    ]
    assert run.status == "FAILED" and "max_frequency" in run.tags["error"]
    assert "error.txt" in {f.path for f in t.store.client.list_artifacts(run.run_id)}
    assert t.queries.get_run_data(summary.parent_run_id).tags["cells_failed"] == "1"
    # Running it again redoes only the failed cell.
    again = run_benchmark(cfg)
    assert {r.method: r.status for r in again.results} == {
        "neural_laplace": "failed",
        "node": "reused",
    }


def test_same_config_and_seed_same_run(mlflow_store):
    cell = CellConfig(
        system="integro_de",
        method="neural_laplace",
        seed=3,
        data={"n_trajectories": 30},
        training=TrainConfig(epochs=2, batch_size=8),
    )
    t = connect()
    rt = CellRuntime.for_store(t.store, parent_run_id=None, profile="smoke", device="cpu")
    a, b = run_cell(cell, rt), run_cell(cell, rt)
    assert a.ok and b.ok and a.run_id != b.run_id
    assert a.test_rmse == b.test_rmse
    hist = [
        [m.value for m in t.store.client.get_metric_history(r.run_id, "train_loss")] for r in (a, b)
    ]
    assert hist[0] == hist[1]


@pytest.mark.heavy  # the flow again in spawned worker processes
def test_worker_processes_give_the_same_results(first):
    # Cells trained in spawned worker processes (the quick/paper default) match in-thread ones.
    cfg = _config(seeds=[0], isolation="process", tracking={"experiment": "isolated"})
    summary = run_benchmark(cfg)
    assert summary.count("finished") == 4 and summary.ok
    ref = {r.key: r.test_rmse for r in first.results}
    for r in summary.results:
        assert r.test_rmse == pytest.approx(ref[r.key], rel=1e-9, abs=1e-12)


@pytest.mark.heavy  # the flow again unpacked (test_pack_bitwise checks each model)
def test_packing_does_not_change_any_result(first):
    # The same cells trained one by one (--no-pack) give every cell the packed run's result.
    summary = run_benchmark(_config(pack=False, tracking={"experiment": "unpacked"}))
    assert summary.count("finished") == 8 and summary.ok
    packed = {r.key: r.test_rmse for r in first.results}
    for r in summary.results:
        assert abs(r.test_rmse - packed[r.key]) <= 1e-8, r.key


def test_the_native_kernels_line_is_said_only_of_a_run_with_float64_neural_laplace_on_the_cpu():
    from flows.benchmark import native_kernels_note

    with_nl = _config().cells()
    user_only = _config(methods=["node"]).cells()
    assert native_kernels_note(with_nl, "cpu", True) == (
        "float64 Neural Laplace on the CPU runs the native C kernels"
    )
    assert "pure-torch path" in str(native_kernels_note(with_nl, "auto", False))
    assert native_kernels_note(user_only, "cpu", True) is None  # no Neural Laplace cell
    assert native_kernels_note(with_nl, "cuda", True) is None  # every cell on the GPU
    float32 = _config(training={"dtype": "float32"}).cells()
    assert native_kernels_note(float32, "cpu", True) is None
