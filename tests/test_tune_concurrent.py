"""Two processes tuning one study: the study ends at its trial count, with no point drawn twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parent.parent

_TUNE = """
import json, sys, time
from pathlib import Path
import torch
from tasks.tuning import TuneSpec, run_tuning
torch.set_num_threads(1)
spec = TuneSpec(**json.loads(sys.argv[1]))
print("ready", flush=True)
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.01)
run_tuning(spec)
"""


def _until_ready(proc: subprocess.Popen) -> str:
    """What ``proc`` printed up to its ready line (it fails the test if the process ends first)."""
    lines = []
    while (line := proc.stdout.readline()).strip() != "ready":
        assert line, "".join(lines)  # ended before it was ready
        lines.append(line)
    return "".join(lines)


@pytest.mark.heavy  # two tuning commands at once
def test_two_processes_on_one_study_stop_at_its_total_and_never_draw_the_same_point(
    tmp_path, mlflow_store
):
    spec = {
        "method": "neural_laplace",
        "system": "integro_de",
        "profile": "smoke",
        "n_trials": 6,
        "startup_trials": 6,  # random sampling throughout: the seed decides every point
        "start_from_paper": False,
        "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
        "overrides": {
            "data": {"n_trajectories": 24, "n_points": 24},
            "training": {"epochs": 2, "batch_size": 8},
            "progress": False,
        },
    }
    # Create the store and the study once (as a first `nllab tune` would): this test is about
    # the trials, not the creation of the stores.
    from tasks.tracking import connect
    from tasks.tuning import PARENT_ATTR, TuneSpec, open_storage

    connect()

    name = TuneSpec(**spec).study_name
    optuna.create_study(storage=open_storage(spec["storage"]), study_name=name)
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _TUNE, json.dumps(spec), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    said = [_until_ready(p) for p in procs]  # both imported and waiting
    go.touch()
    outs = [before + p.communicate(timeout=600)[0] for before, p in zip(said, procs, strict=True)]
    assert [p.returncode for p in procs] == [0, 0], "\n---\n".join(outs)

    study = optuna.load_study(study_name=name, storage=spec["storage"])
    counted = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(counted) == 6, [(t.number, t.state) for t in study.trials]
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    points = [json.dumps(t.params, sort_keys=True) for t in counted]
    assert len(set(points)) == len(points), points
    # Both processes started the study at once; one parent run holds both processes' trials.
    tracker = connect()
    parents = tracker.store.client.search_runs(
        [tracker.experiment_id], "tags.`nllab.kind` = 'tune'", max_results=10
    )
    assert len(parents) == 1, [p.info.run_id for p in parents]
    assert study.user_attrs[PARENT_ATTR] == parents[0].info.run_id


def test_the_sampler_replays_a_study_from_its_seed(tmp_path):
    from tasks.tuning import TrialSeededTPE

    def draws(seed: int) -> list[float]:
        study = optuna.create_study(sampler=TrialSeededTPE(seed=seed, n_startup_trials=3))
        study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=5)
        return [t.params["x"] for t in study.trials]

    assert draws(0) == draws(0)
    assert draws(0) != draws(1)


def test_openers_of_one_fresh_sqlite_storage_at_once_all_succeed(tmp_path, open_storage_at_once):
    """Each opener creates the tables if absent; losers of that race retry instead of failing."""
    from tasks.tuning import open_storage

    for k in range(4):  # a race is won by chance: a few fresh files
        errors = open_storage_at_once(f"sqlite:///{tmp_path / f'race{k}.db'}")
        assert not errors, errors
    # and the store is usable: one study, seen by a new opener
    url = f"sqlite:///{tmp_path / 'race0.db'}"
    optuna.create_study(storage=open_storage(url), study_name="s")
    assert [s.study_name for s in optuna.get_all_study_summaries(open_storage(url))] == ["s"]
