"""The MLflow adapter: store creation, run states, lookups, the registry, concurrent writers."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nlmodels import build_model
from nltrain import TrainingInterrupted, seeded
from tasks.config import TrackingConfig
from tasks.modelio import ModelSpec, load_model, save_model
from tasks.tracking import (
    RunTags,
    Tracking,
    TrackingSettings,
    TrackingUnavailable,
    attach,
    connect,
    parent_run,
)

STATUSES = ("finished", "reused", "reused", "failed")


def test_embedded_default_lives_under_data_home(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("NLLAB_ARTIFACT_ROOT", raising=False)
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    s = TrackingSettings.resolve()
    assert s.tracking_uri == f"sqlite:///{tmp_path / 'home' / 'mlflow' / 'mlflow.db'}"
    assert s.artifact_root == str(tmp_path / "home" / "mlflow" / "artifacts")
    # explicit config beats the environment
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere.db")
    s2 = TrackingSettings.resolve(TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/x.db"))
    assert s2.tracking_uri == f"sqlite:///{tmp_path}/x.db"


def test_connect_creates_store_and_experiment(mlflow_store):
    t = connect(TrackingConfig(experiment="exp-a"))
    assert (mlflow_store / "mlflow.db").is_file()
    exp = t.store.client.get_experiment(t.experiment_id)
    assert exp.name == "exp-a"
    assert exp.artifact_location == str(mlflow_store / "artifacts")
    assert connect(TrackingConfig(experiment="exp-a")).experiment_id == t.experiment_id


def test_a_command_connects_once_per_store_and_afresh_when_the_store_changed(monkeypatch, tmp_path):
    """A second ``connect`` to the same store returns the tracker already opened; another
    home, experiment or a deleted store gets a fresh, checked connection."""

    def use_home(home: Path) -> None:  # as a new command in that home sees the environment
        monkeypatch.setenv("NLLAB_HOME", str(home))
        for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT", "NLLAB_EXPERIMENT"):
            monkeypatch.delenv(var, raising=False)

    home = tmp_path / "home"
    use_home(home)
    first = connect()
    assert connect() is first and connect(TrackingConfig()) is first
    other = connect(TrackingConfig(experiment="other"))
    assert other is not first and other.experiment_id != first.experiment_id
    assert connect(TrackingConfig(experiment="other")) is other
    other.store.client.delete_experiment(other.experiment_id)  # meanwhile, in the UI or a script
    with pytest.raises(TrackingUnavailable, match="experiment 'other' is deleted"):
        connect(TrackingConfig(experiment="other"))

    # A run left RUNNING by a process that is gone is still ended by a reused connection.
    orphan = first.runs.create_run("orphan", {"nllab.kind": "cell"})
    first.runs.set_tags(orphan, {"nllab.process": "999999999:1"})  # no such pid on this host
    assert connect() is first
    assert first.queries.get_run_data(orphan).status == "KILLED"

    moved = tmp_path / "moved"
    use_home(moved)  # another home: its own store
    elsewhere = connect()
    assert elsewhere is not first
    assert elsewhere.store.settings.tracking_uri.endswith(f"{moved}/mlflow/mlflow.db")
    assert (moved / "mlflow" / "mlflow.db").is_file()

    use_home(home)
    assert connect() is first
    (home / "mlflow" / "mlflow.db").unlink()  # the store deleted: created again
    again = connect()
    assert again is not first and (home / "mlflow" / "mlflow.db").stat().st_size > 0
    assert again.store.client.get_experiment(again.experiment_id).name == "nllab"
    assert connect() is again


def test_a_parent_run_ends_as_its_command_ends(mlflow_store):
    """``parent_run``: tags, params, ``execution.*`` tags and the config file; FINISHED when
    the block completes, FAILED with the error when it raises, KILLED when interrupted."""
    t = connect()
    with parent_run(
        t.runs,
        "bench",
        kind="benchmark",
        params={"profile": "smoke"},
        tags={RunTags.PROFILE: "smoke"},
        execution={"device": "cpu"},
        config_json=('{"a": 1}', "run_config.json"),
    ) as run:
        run.record_cells(
            [SimpleNamespace(status=s, ok=s in ("finished", "reused")) for s in STATUSES],
            note="one failed",
        )
    done = t.queries.get_run_data(run.run_id)
    assert done.status == "FINISHED"
    assert done.params == {"profile": "smoke"}
    tags = done.tags
    assert tags[RunTags.KIND] == "benchmark" and tags[RunTags.PROFILE] == "smoke"
    assert tags[f"{RunTags.EXECUTION_PREFIX}device"] == "cpu"
    counts = [RunTags.CELLS, RunTags.CELLS_FINISHED, RunTags.CELLS_REUSED, RunTags.CELLS_FAILED]
    assert [tags[k] for k in counts] == ["4", "1", "2", "1"]
    assert tags[RunTags.NOTE] == "one failed"
    assert [f.path for f in t.store.client.list_artifacts(run.run_id)] == ["run_config.json"]
    assert t.queries.latest_run("benchmark") == run.run_id
    with pytest.raises(ValueError), parent_run(t.runs, "bad", kind="benchmark") as failed:
        raise ValueError("no cells")
    with pytest.raises(KeyboardInterrupt), parent_run(t.runs, "stop", kind="study:x") as stopped:
        raise KeyboardInterrupt
    assert t.queries.get_run_data(failed.run_id).status == "FAILED"
    assert t.queries.get_run_data(failed.run_id).tags[RunTags.ERROR] == "ValueError: no cells"
    assert t.queries.get_run_data(stopped.run_id).status == "KILLED"
    with parent_run(t.runs, "again", kind="benchmark", resume=failed.run_id) as resumed:
        assert resumed.run_id == failed.run_id
    assert t.queries.get_run_data(failed.run_id).status == "FINISHED"
    assert t.queries.get_run_data(failed.run_id).tags[RunTags.RESUMED] == "true"


def test_unreachable_server_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    t0 = time.perf_counter()
    with pytest.raises(
        TrackingUnavailable,
        match=r"(?s)http://127.0.0.1:9.*Connection refused.*MLFLOW_TRACKING_URI",
    ):
        connect()
    assert time.perf_counter() - t0 < 30


def test_run_states(mlflow_store):
    t = connect()
    with t.runs.run("ok", {"nllab.kind": "cell"}) as ok:
        t.runs.log_metrics(ok, {"m": 1.0}, step=3)
    with pytest.raises(ValueError), t.runs.run("bad", {"nllab.kind": "cell"}) as bad:
        raise ValueError("broken cell")
    with pytest.raises(TrainingInterrupted), t.runs.run("int", {}) as stopped:
        raise TrainingInterrupted("stop")
    with pytest.raises(KeyboardInterrupt), t.runs.run("ctrl-c", {}) as killed:
        raise KeyboardInterrupt
    status = {r: t.queries.get_run_data(r).status for r in (ok, bad, stopped, killed)}
    assert status == {ok: "FINISHED", bad: "FAILED", stopped: "KILLED", killed: "KILLED"}
    assert t.queries.get_run_data(bad).tags["error"] == "ValueError: broken cell"
    hist = t.store.client.get_metric_history(ok, "m")
    assert [(m.step, m.value) for m in hist] == [(3, 1.0)]


def test_the_run_life_cycle_takes_an_early_end_and_outcome_tags(mlflow_store):
    """``RunLog.run``, the one run life cycle (cells, parents, trials): a run the block ended
    itself keeps that end; ``killed_by`` errors end KILLED; ``outcome_tags`` tags every end."""

    def state(error: BaseException | None) -> dict[str, str]:
        return {"outcome": "none" if error is None else type(error).__name__}

    runs, queries = connect().runs, connect().queries
    with runs.run("kept", {}) as kept:
        runs.end_with_error(kept, ValueError("member diverged"))
    with runs.run("fenced", {}) as fenced:
        runs.end_with_error(fenced, RuntimeError("claim lost"), killed=True)
    with pytest.raises(LookupError), runs.run("pruned", {}, killed_by=(LookupError,)) as pruned:
        raise LookupError("pruned at epoch 3")
    with runs.run("done", {}, outcome_tags=state) as done:
        pass
    with pytest.raises(ValueError), runs.run("failed", {}, outcome_tags=state) as failed:
        raise ValueError("x")
    got = {r: queries.get_run_data(r) for r in (kept, fenced, pruned, done, failed)}
    assert {r: run.status for r, run in got.items()} == {
        kept: "FAILED",
        fenced: "KILLED",
        pruned: "KILLED",
        done: "FINISHED",
        failed: "FAILED",
    }
    assert got[kept].tags["error"] == "ValueError: member diverged"
    assert got[done].tags["outcome"] == "none"
    assert got[failed].tags["outcome"] == "ValueError"
    assert got[failed].tags["error"] == "ValueError: x"


def test_light_tracking_modules_load_without_mlflow():
    """The command line's pre-checks ask these before anything heavy loads."""
    code = (
        "import sys\n"
        "import tasks.errors, tasks.tracking.locations, tasks.tracking.processes\n"
        "from tasks.tracking.tags import Metrics, RunTags\n"
        "heavy = [m for m in ('mlflow', 'torch', 'prefect') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_platform_errors_share_their_family_by_type():
    """Errors are classified by type (``isinstance``), never by class name."""
    from flows.runtime._dask import DaskSetupError, DaskUnreachable
    from tasks.errors import Interrupted, SettingError, Unreachable
    from tasks.tuning.spec import StorageUnavailable, TuningError

    assert all(issubclass(e, Unreachable) for e in (TrackingUnavailable, StorageUnavailable))
    assert issubclass(DaskUnreachable, Unreachable) and issubclass(DaskUnreachable, SettingError)
    assert issubclass(TuningError, SettingError) and issubclass(DaskSetupError, SettingError)
    assert issubclass(TrainingInterrupted, Interrupted)
    assert not issubclass(TrackingUnavailable, SettingError)


def test_registered_version_reads_the_embedded_registry(tmp_path):
    """``locations.registered_version``: the sqlite tables, read-only, without MLflow."""
    from tasks.tracking.locations import registered_version

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    assert registered_version("m@champion", uri) == (False, [])  # no store: nothing there
    with sqlite3.connect(db) as c:
        c.execute("create table registered_models (name text)")
        c.execute("create table registered_model_aliases (name text, alias text, version int)")
        c.execute("create table model_versions (name text, version int)")
        c.execute("insert into registered_models values ('m'), ('a')")
        c.execute("insert into registered_model_aliases values ('m', 'champion', 2)")
        c.execute("insert into model_versions values ('m', 2)")
    assert registered_version("m@champion", uri) == (True, [])
    assert registered_version("m/2", uri) == (True, [])
    assert registered_version("m/3", uri) == (False, ["a", "m"])
    assert registered_version("m@best", uri) == (False, ["a", "m"])
    assert registered_version("m@champion", "http://127.0.0.1:9")[0] is None


def test_finished_cells_ignore_unfinished_runs(mlflow_store):
    t = connect()
    with t.runs.run("a", {"nllab.kind": "cell", "config_hash": "h1"}) as old:
        t.runs.log_metrics(old, {"test_rmse": 0.5})
    with t.runs.run("b", {"nllab.kind": "cell", "config_hash": "h1"}) as new:
        t.runs.log_metrics(new, {"test_rmse": 0.4})
    t.runs.create_run("c", {"nllab.kind": "cell", "config_hash": "h2"})  # left RUNNING
    with pytest.raises(RuntimeError), t.runs.run("d", {"nllab.kind": "cell", "config_hash": "h3"}):
        raise RuntimeError
    with t.runs.run("e", {"nllab.kind": "benchmark", "config_hash": "h4"}):
        pass
    found = t.queries.finished_cells(["h1", "h2", "h3", "h4", "h5"])
    assert set(found) == {"h1"}
    assert found["h1"].run_id == new and found["h1"].test_rmse == 0.4


def _model_run(t: Tracking, rmse: float, tmp: Path) -> str:
    with seeded(int(rmse * 1000)):
        model = build_model("node", 1)
    spec = ModelSpec(method="node", state_dim=1, test_rmse=rmse)
    with t.runs.run(f"m{rmse}", {"nllab.kind": "cell"}) as run_id:
        save_model(model, spec, tmp / run_id)
        t.runs.log_artifact(run_id, tmp / run_id, "model")
    return run_id


def test_champion_moves_only_when_beaten(mlflow_store, tmp_path):
    t = connect()
    name = "neural-laplace-test"
    first = _model_run(t, 0.30, tmp_path)
    p1 = t.registry.promote_if_better(name, first, 0.30)
    assert p1.promoted and p1.version == "1" and p1.previous_rmse is None
    worse = _model_run(t, 0.35, tmp_path)
    p2 = t.registry.promote_if_better(name, worse, 0.35)
    assert not p2.promoted and p2.previous_rmse == 0.30
    assert t.registry.champion(name) == ("1", first)
    assert t.registry.promote_if_better(name, first, 0.30).promoted is False  # idempotent re-run
    better = _model_run(t, 0.10, tmp_path)
    p3 = t.registry.promote_if_better(name, better, 0.10)
    assert p3.promoted and t.registry.champion(name) == (p3.version, better)
    versions = t.store.client.search_model_versions(f"name = '{name}'")
    assert sorted(v.run_id for v in versions) == sorted([first, better])  # nothing deleted
    model, spec = load_model(t.registry.download_model(f"models:/{name}@champion", tmp_path / "dl"))
    assert spec.test_rmse == 0.10
    ref, _ = load_model(tmp_path / better)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    # a run's model by its runs:/ URI: the same weights; a malformed URI says what is accepted
    by_run, _ = load_model(t.registry.download_model(f"runs:/{better}/model", tmp_path / "run"))
    assert all(torch.equal(a, b) for a, b in zip(by_run.parameters(), ref.parameters()))
    with pytest.raises(LookupError, match=r"expected a model URI \(models:/NAME@ALIAS"):
        t.registry.download_model("runs:/abc/model")
    with pytest.raises(LookupError, match="no registered model"):
        t.registry.download_model("models:/no-such-model@champion", tmp_path / "dl2")


@pytest.mark.heavy  # processes writing one store at once
def test_concurrent_writers_keep_sqlite_intact(mlflow_store):
    shared = connect()
    n_threads, n_steps = 6, 40
    runs: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        # half share the command's tracker, half a worker's own (attach, as task workers)
        t = shared if i % 2 else attach(shared.store.settings, shared.experiment_id)
        try:
            with t.runs.run(f"w{i}", {"nllab.kind": "cell", "config_hash": f"h{i}"}) as rid:
                t.runs.log_params(rid, {f"p{k}": k for k in range(30)})
                for s in range(n_steps):
                    t.runs.log_metrics(rid, {"a": s, "b": i}, step=s)
                t.runs.log_text(rid, f"writer {i}", "note.txt")
                t.runs.log_dataset(rid, name="same", digest="d" * 36, source="/x", profile={"n": 1})
            with lock:
                runs.append(rid)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(runs) == n_threads
    for rid in runs:
        r = shared.store.client.get_run(rid)
        assert r.info.status == "FINISHED" and len(r.data.params) == 30
        assert len(shared.store.client.get_metric_history(rid, "a")) == n_steps
        assert len(r.inputs.dataset_inputs) == 1
    with sqlite3.connect(mlflow_store / "mlflow.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_logged_model_warns_of_nothing_and_keeps_its_tensor_signature(mlflow_store):
    """MLflow would warn that it cannot infer a signature from the pyfunc's dict input (a
    warning no filter holds back reliably when threads log at once): it infers none, and the
    signature given explicitly is the model's."""
    import warnings

    import mlflow
    from cells import tiny_cell

    from tasks.cell import CellRuntime, run_cell

    t = connect()
    rt = CellRuntime.for_store(t.store, parent_run_id=None, profile="smoke", device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        result = run_cell(tiny_cell(), rt)
        assert warnings.filters == filters  # nothing held back by a filter: nothing said
    assert result.status == "finished", result.error
    assert not [str(w.message) for w in caught if "signature" in str(w.message).lower()]
    info = mlflow.models.get_model_info(f"models:/{t.queries.logged_model_id(result.run_id)}")
    assert [s["name"] for s in info.signature.inputs.to_dict()] == ["obs_t", "obs_x", "query_t"]
