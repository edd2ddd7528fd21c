"""Faults a user meets: a copied home that must stay independent of the original, a finished run
whose model was deleted, a claimant that lost its claim while stopped, a worker process killed
mid-cell, a registry alias whose run is gone, and bookkeeping kept out of the user's runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nlmodels import build_model
from nltrain import seeded
from tasks.cell import CellRuntime, run_pack
from tasks.config import CellConfig, TrainConfig
from tasks.engine import stored_results
from tasks.modelio import ModelSpec, load_model, save_model
from tasks.tracking import Tracking, connect


def _use_home(monkeypatch, home: Path) -> None:
    monkeypatch.setenv("NLLAB_HOME", str(home))
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT"):
        monkeypatch.delenv(var, raising=False)


def _cell_run(t: Tracking, tmp: Path, config_hash: str, rmse: float = 0.5) -> str:
    """A FINISHED cell run of ``config_hash`` with a saved (untrained) model, as a cell logs it."""
    with seeded(0):
        model = build_model("node", 1)
    with t.runs.run("cell", {"nllab.kind": "cell", "config_hash": config_hash}) as run_id:
        save_model(model, ModelSpec(method="node", state_dim=1, test_rmse=rmse), tmp / run_id)
        t.runs.log_artifact(run_id, tmp / run_id, "model")
        t.runs.log_metrics(run_id, {"test_rmse": rmse})
    return run_id


def _artifacts(t: Tracking, run_id: str) -> Path:
    return Path(t.queries.get_run_data(run_id).artifact_uri)


def _cell(seed: int, epochs: int = 2) -> CellConfig:
    return CellConfig(
        system="integro_de",
        method="node",
        seed=seed,
        data={"n_trajectories": 24, "n_points": 30},
        training=TrainConfig(epochs=epochs, batch_size=8),
    )


# -- a self-contained home -----------------------------------------------------------------------
def test_a_copied_home_writes_only_into_itself(tmp_path, monkeypatch):
    A, B = "a1" * 32, "b2" * 32
    _use_home(monkeypatch, tmp_path / "orig")
    t = connect()
    first = _cell_run(t, tmp_path / "m", A)
    assert t.registry.promote_if_better("neural-laplace-copy", first, 0.5).promoted
    orig_root = tmp_path / "orig" / "mlflow" / "artifacts"
    t.runs.log_dataset(
        first, name="d", digest="0" * 36, source=f"{tmp_path}/orig/cache", profile={}
    )
    mlmodel = orig_root / "models" / "m-1" / "artifacts" / "MLmodel"  # as MLflow writes one
    mlmodel.parent.mkdir(parents=True)
    mlmodel.write_text(f"artifact_path: {mlmodel.parent}\nflavors: {{}}\n")
    shutil.copytree(tmp_path / "orig", tmp_path / "copy", symlinks=True)  # cp -a

    _use_home(monkeypatch, tmp_path / "copy")
    c = connect()
    second = _cell_run(c, tmp_path / "m", B)
    for run in (first, second):
        assert _artifacts(c, run).is_relative_to(tmp_path / "copy")
    copied = tmp_path / "copy" / "mlflow" / "artifacts" / "models" / "m-1" / "artifacts"
    assert (copied / "MLmodel").read_text().startswith(f"artifact_path: {copied}\n")
    with sqlite3.connect(tmp_path / "copy" / "mlflow" / "mlflow.db") as db:
        (source,) = db.execute("select dataset_source from datasets").fetchone()
    assert json.loads(source)["uri"] == f"{tmp_path}/copy/cache"
    assert not [p for p in (tmp_path / "orig").rglob("*") if second in p.name]

    shutil.rmtree(tmp_path / "orig")  # loses nothing of the copy's
    found, broken = c.queries.reusable_cells([A, B])
    assert set(found) == {A, B} and not broken
    champion = c.registry.download_model("models:/neural-laplace-copy@champion", tmp_path / "d")
    assert load_model(champion)[1].test_rmse == 0.5


def test_a_finished_run_without_a_usable_model_is_trained_again(mlflow_store, tmp_path, capsys):
    t = connect()
    gone, corrupt, fine = _cell(0), _cell(1), _cell(2)
    runs = {c.seed: _cell_run(t, tmp_path, c.config_hash()) for c in (gone, corrupt, fine)}
    reused, todo = stored_results(t.queries, [gone, corrupt, fine], "config")
    assert len(reused) == 3 and not todo

    shutil.rmtree(_artifacts(t, runs[0]) / "model")
    (weights,) = [p for p in (_artifacts(t, runs[1]) / "model").iterdir() if p.suffix != ".json"]
    weights.write_bytes(b"not a torch file")
    capsys.readouterr()
    reused, todo = stored_results(t.queries, [gone, corrupt, fine], "config")
    assert [r.run_id for r in reused] == [runs[2]] and todo == [gone, corrupt]
    err = capsys.readouterr().err.splitlines()
    for seed, why in ((0, "is missing"), (1, "does not load")):
        (line,) = [ln for ln in err if runs[seed] in ln]  # one line each, naming the run
        assert why in line and "training it again" in line
    stored_results(t.queries, [gone, corrupt], "config")
    assert not capsys.readouterr().err  # said once


def test_a_finished_run_whose_logged_model_is_gone_is_trained_again(mlflow_store, tmp_path, capsys):
    """Cells log their model as an MLflow 3 logged model (not among the run's artifacts): a
    finished run whose logged model's folder is gone is trained again, said in one line."""
    t = connect()
    gone, fine = _cell(0), _cell(1)
    runs = {}
    for c in (gone, fine):
        with seeded(0):
            model = build_model("node", 1)
        with t.runs.run("cell", {"nllab.kind": "cell", "config_hash": c.config_hash()}) as run_id:
            save_model(
                model, ModelSpec(method="node", state_dim=1, test_rmse=0.5), tmp_path / run_id
            )
            t.runs.log_model(run_id, tmp_path / run_id)
            t.runs.log_metrics(run_id, {"test_rmse": 0.5})
        runs[c.seed] = run_id
    reused, todo = stored_results(t.queries, [gone, fine], "config")
    assert len(reused) == 2 and not todo
    assert not (_artifacts(t, runs[0]) / "model").exists()  # the model is not a run artifact
    location = t.store.client.get_logged_model(t.queries.logged_model_id(runs[0])).artifact_location
    shutil.rmtree(Path(location.removeprefix("file://")))
    capsys.readouterr()
    reused, todo = stored_results(t.queries, [gone, fine], "config")
    assert [r.run_id for r in reused] == [runs[1]] and todo == [gone]
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if runs[0] in ln]
    assert "is missing" in line and "training it again" in line


# -- no double training --------------------------------------------------------------------------
def test_a_claimant_that_lost_its_claim_does_not_log_finished(
    mlflow_store, tmp_path, monkeypatch, capsys
):
    import tasks.cell as cell_module

    monkeypatch.setattr(cell_module, "CLAIM_POLL_SECONDS", 0.05)
    t = connect()
    # the other host's run is hand-made (no numerics fingerprints): reused by config hash
    rt = CellRuntime.for_store(
        t.store, parent_run_id=None, profile="smoke", device="cpu", reuse="config"
    )
    cell = _cell(5)
    h = cell.config_hash()
    thief = "host-x[1]/4242:7/abcd"
    real = cell_module.fit_cells
    taken: list[str] = []

    def stopped_past_the_stale_time(cells, rt_, run_ids, **kw):
        out = real(cells, rt_, run_ids, **kw)
        # While this process was stopped, another host took the stale claim over and trains
        # the cell; it finishes it a moment later.
        assert t.claims.claim_cell(h, thief, stale_after=0.0)

        def finish_elsewhere() -> None:
            taken.append(_cell_run(t, tmp_path, h, rmse=0.25))
            t.claims.release_cell(h, thief)

        threading.Timer(0.5, finish_elsewhere).start()
        return out

    monkeypatch.setattr(cell_module, "fit_cells", stopped_past_the_stale_time)
    (result,) = run_pack([cell], rt)
    assert result.status == "reused" and result.run_id == taken[0]
    runs = t.store.client.search_runs([t.experiment_id], f"tags.config_hash = '{h}'")
    status = sorted(r.info.status for r in runs)
    assert status == ["FINISHED", "KILLED"]  # one FINISHED run for the config hash
    (killed,) = [r for r in runs if r.info.status == "KILLED"]
    assert "lost its claim" in killed.data.tags["error"]
    err = capsys.readouterr().err
    assert err.count("waiting for cell") == 1
    assert "held by pid 4242 on host host-x since" in err


# -- a worker's death fails its own cell ---------------------------------------------------------
def test_a_dead_worker_fails_only_its_own_call(tmp_path):
    from tasks.machine.workers import WorkerDied, run_in_worker, worker_pids, worker_processes

    # Each call holds its worker (a shell waiting for a file, two minutes at most) until the
    # test releases it, after the kill: the victim is busy when it dies however slowly the
    # machine runs (a fixed 3 s sleep could end first on a loaded machine, leaving an idle
    # worker to kill and both calls succeeding).
    release = tmp_path / "release"
    hold = ["timeout", "120", "sh", "-c", f'while [ ! -e "{release}" ]; do sleep 0.02; done']
    with worker_processes(2), ThreadPoolExecutor(2) as ex:
        calls = [ex.submit(run_in_worker, subprocess.call, hold) for _ in range(2)]
        deadline = time.monotonic() + 60
        while len(worker_pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        victim = worker_pids()[0]  # each worker is handed its call as it is started
        os.kill(victim, signal.SIGKILL)
        release.touch()
        outcomes = []
        for call in calls:
            try:
                outcomes.append(call.result())
            except WorkerDied as e:
                outcomes.append(e)
        died = [o for o in outcomes if isinstance(o, WorkerDied)]
        assert len(died) == 1 and outcomes.count(0) == 1  # the other call's shell: exit 0
        assert died[0].pid == victim and "SIGKILL" in str(died[0])
        # the pool replaced the dead worker and goes on
        assert run_in_worker(os.getpid) not in (victim, os.getpid())
    assert worker_pids() == []


@pytest.mark.heavy  # a worker process killed -9
def test_kill_9_of_one_worker_fails_only_its_cell(mlflow_store):
    from tasks.machine.workers import worker_processes
    from tasks.prefect_tasks import PackFailed, pack_task

    t = connect()
    rt = CellRuntime.for_store(t.store, parent_run_id=None, profile="smoke", device="cpu")
    doomed, survivor = _cell(6, epochs=3000), _cell(7, epochs=2)

    def run(cell: CellConfig):
        try:
            return pack_task.fn([cell], rt)
        except PackFailed as e:
            return list(e.results)

    with worker_processes(2), ThreadPoolExecutor(2) as ex:
        futures = [ex.submit(run, doomed), ex.submit(run, survivor)]
        query = f"tags.config_hash = '{doomed.config_hash()}' and attributes.status = 'RUNNING'"
        deadline = time.monotonic() + 120
        while not (running := t.store.client.search_runs([t.experiment_id], query)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(int(running[0].data.tags["nllab.process"].split(":")[0]), signal.SIGKILL)
        (lost,), (kept,) = (f.result(timeout=180) for f in futures)
    assert lost.status == "failed" and "WorkerDied" in lost.error
    assert kept.status == "finished"
    runs = {r.data.tags["seed"]: r for r in t.store.client.search_runs([t.experiment_id], "")}
    assert runs["6"].info.status == "FAILED" and "died" in runs["6"].data.tags["error"]
    assert runs["7"].info.status == "FINISHED"


# -- the registry never points at nothing --------------------------------------------------------
def test_an_alias_whose_run_is_gone_is_replaced_and_reproduce_says_so(
    mlflow_store, tmp_path, capsys
):
    from mlflow.tracking._tracking_service.utils import _get_store

    from flows.cli import main
    from flows.reproduce import deleted_run_warning, resolve_model

    t = connect()
    name, h = "neural-laplace-gone", "c3" * 32
    uri = f"models:/{name}@champion"
    champion = _cell_run(t, tmp_path, h)
    assert t.registry.promote_if_better(name, champion, 0.5).promoted
    deleted = _cell_run(t, tmp_path, h, rmse=0.1)
    t.store.client.delete_run(deleted)
    assert not t.registry.promote_if_better(name, deleted, 0.1).promoted  # a deleted run is skipped

    t.store.client.delete_run(champion)  # soft-deleted: still reproducible, with a warning
    warning = deleted_run_warning(resolve_model(t, uri))
    assert warning and champion in warning and "\n" not in warning

    _get_store()._hard_delete_run(champion)  # as `mlflow gc` does
    capsys.readouterr()
    assert main(["reproduce", uri]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and champion in err and "Traceback" not in err

    again = _cell_run(t, tmp_path, h)  # an equal retrain replaces the alias
    p = t.registry.promote_if_better(name, again, 0.5)
    assert p.promoted and t.registry.champion(name) == (p.version, again)

    shutil.rmtree(_artifacts(t, again) / "model")  # a champion without its model: replaced too
    third = _cell_run(t, tmp_path, h, rmse=0.9)
    assert t.registry.promote_if_better(name, third, 0.9).promoted
    assert resolve_model(t, uri).run_id == third


def test_reproduce_of_a_model_whose_class_is_not_importable_says_how_to_put_it_on_the_path(
    mlflow_store, tmp_path, monkeypatch, capsys
):
    """The weights are stored; only the user's module is missing from the path: the one line
    names PYTHONPATH / pip install, and does not send the user to retrain."""
    import sys

    from flows.cli import main
    from nlmodels import MODELS

    code = tmp_path / "code"
    code.mkdir()
    (code / "h58_own_model.py").write_text(
        "from nlmodels import MODELS\n\nclass Mine(MODELS['node']):\n    pass\n"
    )
    method = "h58_own_model:Mine"
    monkeypatch.syspath_prepend(str(code))
    with seeded(0):
        model = build_model(method, 1)
    t = connect()
    tags = {"nllab.kind": "cell", "config_hash": "d4" * 32, "method": method}
    with t.runs.run("cell", tags) as run_id:
        save_model(model, ModelSpec(method=method, state_dim=1, test_rmse=0.5), tmp_path / "m")
        t.runs.log_artifact(run_id, tmp_path / "m", "model")
        t.runs.log_metrics(run_id, {"test_rmse": 0.5})
    assert t.registry.promote_if_better("own-model", run_id, 0.5).promoted
    # another session: the module is not on the path, nor in the folder the user stands in
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(code)])
    monkeypatch.delitem(sys.modules, "h58_own_model")
    monkeypatch.delitem(MODELS, method)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["reproduce", "models:/own-model@champion"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PYTHONPATH" in err and "pip install" in err, err
    assert "h58_own_model" in err and "nllab benchmark" not in err, err


# -- bookkeeping out of sight --------------------------------------------------------------------
def test_claims_are_not_runs_of_the_users_experiment(mlflow_store):
    t = connect()
    # a store of an older version: its claims run sits in the experiment itself
    old = t.runs.create_run("nllab-claims", {"nllab.kind": "claims"})
    t.runs.end_run(old, "FINISHED")
    t = connect()  # migration: the old run is deleted (hidden, restorable)
    assert t.queries.get_run_data(old).deleted
    assert t.claims.claim_cell("e5" * 32, "owner-a") and t.claims.heartbeat_cell(
        "e5" * 32, "owner-a"
    )
    assert not t.claims.claim_cell("e5" * 32, "owner-b")
    assert t.store.client.search_runs([t.experiment_id], "") == []  # the user sees no run
    holder = t.claims.claim_holder("e5" * 32)
    assert holder is not None and holder.startswith("pid ")


def test_the_bookkeeping_experiment_says_what_it_is_in_the_mlflow_ui(mlflow_store):
    """Its description (MLflow's ``mlflow.note.content``) names the experiment it serves and
    what to do with it, also on one an older version made without a word."""
    t = connect()
    name = f"nllab-bookkeeping-{t.experiment_id}"
    old = t.store.client.create_experiment(name)  # as an older version left it: no description
    assert t.claims.claim_cell("e6" * 32, "owner-a")
    note = t.store.client.get_experiment(old).tags["mlflow.note.content"]
    assert f"for experiment {t.store.settings.experiment!r}" in note
    assert "No results here" in note and "Leave it be" in note


def test_cell_scratch_folders_of_ended_processes_are_removed_and_live_ones_kept(tmp_path):
    """What ``kill -9`` leaves in /tmp (a cell's figures and model, before they were logged)
    goes at the next start; a live process's folder, and an unknown folder, stay."""
    import subprocess
    import sys

    from tasks.scratch import SCRATCH_PREFIX, cell_scratch, remove_stale_scratch

    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = tmp_path / f"{SCRATCH_PREFIX}{ended.stdout.strip()}_1-abc"
    (dead / "model").mkdir(parents=True)
    young_old_style = tmp_path / f"{SCRATCH_PREFIX}12345678"  # an older version's, today's
    young_old_style.mkdir()
    with cell_scratch() as mine:
        live = tmp_path / Path(mine).name
        live.mkdir()
        assert remove_stale_scratch(tmp_path) == [dead]
    assert live.exists() and young_old_style.exists() and not dead.exists()
