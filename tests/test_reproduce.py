"""Reproduce from the registry: same data, same test RMSE to 1e-9, ablations linked to the
source run, clear errors, and a registry that is only read."""

from __future__ import annotations

import pytest
import torch

from flows.reproduce import (
    DataMismatch,
    ablation_cells,
    ablation_table,
    reproduce,
    verify_registered,
)
from tasks.cell import CellRuntime, run_cell
from tasks.config import CellConfig, TrainConfig
from tasks.tracking import Tracking, connect

NAME = "neural-laplace-integro_de"
URI = f"models:/{NAME}@champion"


@pytest.fixture(scope="module")
def registered(module_mlflow_store):
    """A smoke cell trained, logged and registered as champion in a module-wide store."""
    torch.set_num_threads(1)
    cell = CellConfig(
        system="integro_de",
        method="neural_laplace",
        seed=1,
        data={"n_trajectories": 30, "n_points": 40},
        training=TrainConfig(epochs=2, batch_size=8),
    )
    t = connect()
    result = run_cell(cell, CellRuntime.for_store(t.store, parent_run_id=None, profile="smoke"))
    assert result.ok, result.error
    promo = t.registry.promote_if_better(NAME, result.run_id, result.test_rmse)
    assert promo.promoted
    yield cell, result


def _registry_state(t: Tracking):
    return sorted(
        (v.name, v.version, v.run_id, v.source) for v in t.store.client.search_model_versions("")
    ), dict(t.store.client.get_registered_model(NAME).aliases)


def test_registered_model_reproduces_the_logged_test_rmse(registered):
    cell, result = registered
    v = verify_registered(URI)
    assert v.ref.run_id == result.run_id and v.cell == cell
    assert v.logged_rmse == result.test_rmse
    assert abs(v.test_rmse - v.logged_rmse) <= 1e-9
    # By version number too, and from freshly simulated data (no cache).
    again = verify_registered(f"models:/{NAME}/1", fresh_data=True)
    assert abs(again.test_rmse - result.test_rmse) <= 1e-9


def test_changed_simulator_is_a_clear_data_error(registered, monkeypatch, capsys):
    import datasets._simulate
    from flows.cli import main

    monkeypatch.setattr(datasets._simulate, "DATA_VERSION", "changed")
    with pytest.raises(DataMismatch, match="can no longer be rebuilt"):
        verify_registered(URI)
    # the command: one line naming it, exit 1 (it ran, and did not reproduce)
    assert main(["reproduce", URI]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("nllab reproduce: error: ") and "can no longer be rebuilt" in err[-1]


@pytest.mark.parametrize(
    "uri, match",
    [
        ("models:/no-such-model@champion", "no registered model version"),
        (f"models:/{NAME}/99", "no registered model version"),
        (f"models:/{NAME}@no-such-alias", "no registered model version"),
        ("runs:/abc/model", r"expected a model URI \(models:/NAME@ALIAS, "),
    ],
)
def test_unknown_uri_is_a_clear_error(registered, uri, match):
    with pytest.raises(LookupError, match=match):
        verify_registered(uri)


def test_ablation_variants_keep_the_source_config():
    cell = CellConfig(system="integro_de", method="neural_laplace", seed=0)
    variants = ablation_cells(cell, "stereographic")
    assert [v for v, _ in variants] == [True, False]
    assert variants[0][1] is cell and variants[1][1].model == {"stereographic": False}
    # The values are the ablation study's, the source's own value first (its cell unchanged).
    latent = ablation_cells(cell, "latent-dim")
    assert [v for v, _ in latent] == [2, 1, 4, 8, 16, 32] and latent[0][1] is cell
    noise = ablation_cells(cell, "noise")
    assert [c.data.noise_std for _, c in noise] == [0.0, 0.01, 0.1]
    with pytest.raises(ValueError, match="applies to neural_laplace"):
        ablation_cells(cell.model_copy(update={"method": "node"}), "ilt")
    with pytest.raises(ValueError, match="unknown ablation"):
        ablation_cells(cell, "dropout")


def test_ablation_runs_are_linked_and_the_registry_is_untouched(registered, prefect_server):
    _, result = registered
    t = connect()
    before = _registry_state(t)
    out = reproduce(URI, "stereographic")
    assert _registry_state(t) == before  # nothing registered, moved or deleted
    values = {v: r for v, r in out.cells}
    assert values[True].run_id == result.run_id and values[True].status == "reused"
    new = values[False]
    assert new.ok and new.run_id != result.run_id
    run = t.queries.get_run_data(new.run_id)
    assert run.tags["nllab.source_run_id"] == result.run_id
    assert run.tags["mlflow.parentRunId"] == out.run_id
    assert run.params["model.stereographic"] == "False"
    parent = t.queries.get_run_data(out.run_id)
    assert parent.tags["mlflow.parentRunId"] == result.run_id
    assert parent.tags["nllab.kind"] == "reproduce"
    assert parent.metrics["abs_difference"] <= 1e-9
    # printed as the benchmark prints its tables (no Markdown), logged as Markdown
    shown = ablation_table("stereographic", list(out.cells), "terminal")
    assert "|" not in shown and shown.splitlines()[1].startswith("─")
    assert f"{new.test_rmse:.4g}" in shown and new.run_id in shown
    logged = t.store.client.download_artifacts(out.run_id, "ablation.md")
    assert open(logged).read().startswith("| stereographic | status | test RMSE | run |")


def test_cli_reproduce_exit_codes(registered, prefect_server, capsys):
    from flows.cli import main

    assert main(["reproduce", URI]) == 0
    assert "reproduced" in capsys.readouterr().out
    assert main(["reproduce", "models:/nope@champion"]) == 2
    assert "no registered model version" in capsys.readouterr().err
