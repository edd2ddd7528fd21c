"""A model of the user's, named ``module:Class`` on the command line, all the way: trained
beside a built-in one, logged under MLflow-safe names, registered because the user asked for
it (and only it), and reproduced from every model URI ``nllab reproduce`` accepts; the module
found in the working directory, as the lookup rule says."""

from __future__ import annotations

import sys
import textwrap

import pytest

from flows.cli import main
from tasks.tracking import connect

TINY = textwrap.dedent(
    '''
    import torch
    from nlmodels import ForecastModel

    class TinyLast(ForecastModel):
        """The last observed state, scaled by a learnt gain per dimension."""

        def __init__(self, state_dim: int, *, init: float = 0.5) -> None:
            super().__init__()
            self.gain = torch.nn.Parameter(torch.full((state_dim,), init, dtype=torch.float64))

        def forward(self, obs_t, obs_x, query_t):
            return (self.gain * obs_x[:, -1:, :]).expand(-1, query_t.shape[-1], -1)
    '''
)
METHOD = "tiny_route_model:TinyLast"
TOKEN = "tiny_route_model-3ATinyLast"


def test_a_module_class_method_trains_logs_registers_and_reproduces(
    tmp_path, monkeypatch, prefect_server, capsys
) -> None:
    from flows.reproduce import verify_registered

    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT"):
        monkeypatch.delenv(var, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny_route_model.py").write_text(TINY)
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    argv = ["benchmark", "--profile", "smoke", "--systems", "integro_de", "--no-progress"]
    assert main([*argv, "--methods", METHOD, "node", "--register", METHOD]) == 0
    out = capsys.readouterr().out
    name = f"{TOKEN}-integro_de"
    assert f"registry: {name} version 1 is now @champion" in out
    assert "node-integro_de" not in out  # only what the user asked for is registered
    assert str(work) in sys.path  # found in the working directory, kept for workers

    t = connect()
    client = t.store.client
    (run,) = [r for r in t.queries.finished_runs("cell") if r.tags["method"] == METHOD]
    run_id = run.run_id
    assert client.get_run(run_id).info.run_name == f"{TOKEN} · integro_de · s0"
    model_id = t.queries.logged_model_id(run_id)
    assert client.get_logged_model(model_id).name == f"{TOKEN}-integro_de-s0"
    registered = client.get_registered_model(name)
    assert registered.tags == {"method": METHOD, "system": "integro_de"}
    assert [m.name for m in client.search_registered_models()] == [name]

    for uri in (f"models:/{name}/1", f"models:/{model_id}", f"runs:/{run_id}/model"):
        v = verify_registered(uri)
        assert v.ref.run_id == run_id and v.cell.method == METHOD and v.difference <= 1e-9
    assert main(["reproduce", f"models:/{name}@champion"]) == 0
    assert "- reproduced" in capsys.readouterr().out
    for uri, message in (
        ("model.pt", "expected a model URI (models:/NAME@ALIAS, models:/NAME/VERSION, "),
        (f"runs:/{'0' * 32}/model", "no run at"),
        (f"models:/m-{'0' * 32}", "no logged model at"),
    ):
        assert main(["reproduce", uri]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_a_user_module_is_looked_up_in_the_config_folder_then_the_working_directory(
    tmp_path, monkeypatch
) -> None:
    from tasks.config import ConfigError, resolve_config

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    beside = tmp_path / "configs"
    beside.mkdir()
    (beside / "beside_cfg_model.py").write_text(TINY)
    cfg = beside / "c.toml"
    cfg.write_text('systems = ["sine"]\nmethods = ["beside_cfg_model:TinyLast"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (cell,) = resolve_config("smoke", cfg).cells()
    assert cell.method == "beside_cfg_model:TinyLast" and str(beside) in sys.path
    with pytest.raises(ConfigError) as err:
        resolve_config("smoke", cfg, {"methods": ["nowhere_model:Net"]})
    assert str(err.value) == (
        "methods: 'nowhere_model:Net': no module 'nowhere_model' in Python's path (installed "
        f"packages, PYTHONPATH), the config file's folder ({beside}) or the working directory "
        f"({elsewhere})"
    )
