"""The model registry holds standard MLflow models: ``mlflow.pyfunc.load_model`` of the champion
predicts what the run's own model predicts, also after ``$NLLAB_HOME`` has been moved; a promotion
interrupted between registering and moving the alias does not register the run twice."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest

from flows import registry_name, run_benchmark
from nltrain import evaluate
from tasks import load_registered_model
from tasks.cell import prepare_cell, simulate_data
from tasks.config import CellConfig, resolve_config
from tasks.modelio import forecast
from tasks.tracking import connect

SYSTEM = "lotka_volterra_dde"  # the snippet of docs/guide/tracking.md loads its champion


def _readme_block(marker: str) -> str:
    """The ```python block of the README or the docs that contains ``marker``, as the reader
    copies it."""
    root = Path(__file__).parents[1]
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    text = "".join(p.read_text() for p in pages)
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    (block,) = [b for b in blocks if marker in b]
    return block


def _use_home(monkeypatch, home):
    monkeypatch.setenv("NLLAB_HOME", str(home))
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.heavy  # a benchmark, a moved home and a pyfunc load
def test_pyfunc_champion_after_moving_the_home(tmp_path, monkeypatch, prefect_server):
    _use_home(monkeypatch, tmp_path / "home")
    config = resolve_config(
        "smoke",
        None,
        {
            "systems": [SYSTEM],
            "methods": ["neural_laplace"],
            "training": {"epochs": 2},
            "isolation": "thread",
            "progress": False,
        },
    )
    summary = run_benchmark(config)
    assert summary.ok
    uri = f"models:/{registry_name(SYSTEM)}@champion"

    # the run's own predictions, in physical units, through the training code's evaluate()
    model, spec = load_registered_model(uri)
    cell = CellConfig.model_validate(spec.cell)
    prepared = prepare_cell(cell, simulate_data(cell.system, cell.data, cell.seed))
    test, normaliser = prepared.test, prepared.normaliser
    ev, pred = evaluate(model, test, normaliser)
    assert ev.test_rmse == pytest.approx(spec.test_rmse, abs=1e-9)
    own = np.asarray(normaliser.inverse_transform(pred))

    shutil.move(tmp_path / "home", tmp_path / "moved")
    _use_home(monkeypatch, tmp_path / "moved")
    connect()  # any nllab command: follows the moved home
    n = test.obs_x.shape[0]
    inputs = {
        "obs_t": np.broadcast_to(np.asarray(test.obs_t, dtype=float), test.obs_x.shape[:2]),
        "obs_x": np.asarray(normaliser.inverse_transform(np.asarray(test.obs_x)), dtype=float),
        "query_t": np.broadcast_to(np.asarray(test.query_t, dtype=float), (n, own.shape[1])),
    }
    pyfunc = mlflow.pyfunc.load_model(uri)
    assert pyfunc.metadata.get_input_schema().input_names() == ["obs_t", "obs_x", "query_t"]
    got = pyfunc.predict({k: np.ascontiguousarray(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got, own, rtol=1e-9, atol=1e-12)
    # the platform's own loader works from the moved store too
    again, _ = load_registered_model(uri)
    assert all(
        np.array_equal(a.detach().numpy(), b.detach().numpy())
        for a, b in zip(again.state_dict().values(), model.state_dict().values(), strict=True)
    )

    # a promotion killed after registering, before the alias: the rerun reuses the version
    tracker = connect()
    name = registry_name(SYSTEM)
    version, run_id = tracker.registry.champion(name)
    tracker.store.client.delete_registered_model_alias(name, "champion")
    p = tracker.registry.promote_if_better(name, run_id, spec.test_rmse)
    assert p.promoted and p.version == version
    assert len(tracker.store.client.search_model_versions(f"name = '{name}'")) == 1
    mv = tracker.store.client.get_model_version(name, version)
    # the version points at the cell's MLflow 3 logged model, which carries its params and score
    model_id = tracker.queries.logged_model_id(run_id)
    assert model_id is not None and mv.source == f"models:/{model_id}"
    logged = tracker.store.client.get_logged_model(model_id)
    assert logged.source_run_id == run_id and str(logged.status) == "READY"
    assert logged.name == f"neural_laplace-{SYSTEM}-s0"  # the Models tab tells them apart
    assert {m.key: m.value for m in logged.metrics}["test_rmse"] == spec.test_rmse
    assert logged.params["training.epochs"] == "2" and logged.params["method"] == "neural_laplace"
    # linked both ways, as mlflow.register_model links them (the Models tab's "Registered
    # models"), once although the promotion ran twice; its score names the run's data set
    linked = json.loads(logged.tags["mlflow.modelVersions"])
    assert linked == [{"name": name, "version": int(version)}]
    (data,) = tracker.store.client.get_run(run_id).inputs.dataset_inputs
    score = next(m for m in logged.metrics if m.key == "test_rmse")
    assert (score.dataset_name, score.dataset_digest) == (data.dataset.name, data.dataset.digest)
    listed = tracker.store.client.search_logged_models([tracker.experiment_id])
    assert model_id in {m.model_id for m in listed}
    assert pyfunc.metadata.run_id == run_id

    # a fresh shell runs the docs' snippet as written (no stray store in the working folder)
    code = _readme_block("mlflow.pyfunc.load_model") + (
        "np.savez('io.npz', x=x, **inputs)\n"  # what it predicted, from what
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    io = np.load(tmp_path / "io.npz")
    n, tq, d = io["x"].shape
    assert r.stdout.split() == [f"({n},", f"{tq},", f"{d})", run_id] and n > 0 and d == 2
    assert "Warning" not in r.stderr, r.stderr
    np.testing.assert_allclose(
        io["x"], forecast(again, spec, {k: io[k] for k in inputs}), rtol=1e-9, atol=1e-12
    )
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()

    # float32 input is cast to the model's float64 by the platform's own forecaster
    f32 = {k: np.asarray(v, dtype=np.float32) for k, v in inputs.items()}
    np.testing.assert_allclose(forecast(again, spec, f32), own, rtol=1e-4, atol=1e-5)
