"""One cell, one answer: a cell's bytes (test RMSE, weights, history) do not depend on how it
ran — alone or in threads beside other cells (one of them loading models meanwhile, as MLflow's
input-example check does), in a fresh process, packed or not on the CPU."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from nlmodels import build_model
from nltrain import evaluate, train, train_packed
from tasks.config import CellConfig, TrainConfig
from tasks.pipeline import build_cell_model, prepare_cell, simulate_data

ROOT = Path(__file__).resolve().parents[1]
# The smoke benchmark's cells of the thread-versus-Dask comparison (two systems, Neural
# Laplace and NODE), and a second NODE seed to pack with.
_CELLS = [
    ("integro_de", "neural_laplace", 0),
    ("spiral_dde", "neural_laplace", 0),
    ("integro_de", "node", 0),
    ("spiral_dde", "node", 0),
    ("spiral_dde", "node", 1),
]


def _cell(system: str, method: str, seed: int) -> CellConfig:
    training = TrainConfig(epochs=2, batch_size=16, patience=None)
    return CellConfig(
        system=system, method=method, seed=seed, data={"n_trajectories": 40}, training=training
    )


def _digest(model, result, test_rmse: float) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    for e in result.history:
        h.update(repr((e.epoch, e.train_loss, e.val_loss, e.val_rmse, e.nfe)).encode())
    h.update(float(test_rmse).hex().encode())
    return h.hexdigest()


def _setup(spec):
    cell = _cell(*spec)
    prepared = prepare_cell(cell, simulate_data(cell.system, cell.data, cell.seed))
    model, _ = build_cell_model(cell, int(prepared.train.obs_x.shape[-1]))
    return cell, prepared, model


def _score(cell, prepared, model, result) -> str:
    ev, _ = evaluate(model, prepared.test, prepared.normaliser, batch_size=16)
    return _digest(model, result, ev.test_rmse)


def run_cell(spec) -> str:
    """One cell, set up and trained as a worker does (model built under its seed)."""
    cell, prepared, model = _setup(spec)
    result = train(model, prepared.train, prepared.val, cell.training, seed=cell.seed)
    return _score(cell, prepared, model, result)


def run_packed(specs) -> list[str]:
    setups = [_setup(s) for s in specs]
    results = train_packed(
        [m for _, _, m in setups],
        [p.train for _, p, _ in setups],
        [p.val for _, p, _ in setups],
        setups[0][0].training,
        seeds=[c.seed for c, _, _ in setups],
    )
    return [_score(c, p, m, r) for (c, p, m), r in zip(setups, results, strict=True)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # A cell's thread count is part of its numerics (parallel reductions split by thread); the
    # engine pins it per run (``torch_threads``), as the fresh process here does.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def alone(_one_thread) -> dict:
    return {spec: run_cell(spec) for spec in _CELLS}


def _in_threads(specs) -> dict:
    """The cells at once in threads, while another thread keeps building models (unseeded, as
    loading a logged model back does)."""
    stop = threading.Event()

    def load_models() -> None:
        while not stop.is_set():
            build_model("node", 2)

    loader = threading.Thread(target=load_models)
    loader.start()
    try:
        with ThreadPoolExecutor(len(specs)) as pool:
            return dict(zip(specs, pool.map(run_cell, specs), strict=True))
    finally:
        stop.set()
        loader.join()


def test_cells_in_threads_give_their_bytes_alone(alone):
    for _ in range(2):
        assert _in_threads(_CELLS) == alone


def test_a_seeded_build_is_its_seed_beside_other_builds():
    """Initial weights under a seed, while another thread builds models: the seed's weights
    (models drew between another thread's seeding and its build)."""
    spec = ("spiral_dde", "neural_laplace", 0)
    cell = _cell(*spec)
    ref = build_cell_model(cell, 2)[0].state_dict()
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            build_model("node", 2)

    t = threading.Thread(target=hammer)
    t.start()
    try:
        for _ in range(30):
            sd = build_cell_model(cell, 2)[0].state_dict()
            assert all(torch.equal(sd[k], ref[k]) for k in ref)
    finally:
        stop.set()
        t.join()


def test_a_seeded_build_does_not_depend_on_the_default_dtype():
    cell = _cell("spiral_dde", "node", 0)
    ref = build_cell_model(cell, 2)[0].state_dict()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        sd = build_cell_model(cell, 2)[0].state_dict()
    finally:
        torch.set_default_dtype(default)
    assert all(torch.equal(sd[k], ref[k]) for k in ref)


def _fresh_process(specs) -> dict:
    code = (
        "import json, sys, torch; sys.path.insert(0, 'tests'); torch.set_num_threads(1); "
        "from test_one_answer import run_cell; "
        f"print(json.dumps([run_cell(tuple(s)) for s in {json.dumps(specs)}]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return dict(zip(specs, json.loads(out.stdout.splitlines()[-1]), strict=True))


@pytest.mark.heavy  # cells again in a fresh process (threads stay)
def test_a_fresh_process_gives_the_same_bytes(alone):
    specs = [_CELLS[1], _CELLS[3]]  # last in the process here, first there
    assert _fresh_process(specs) == {s: alone[s] for s in specs}


def test_packed_on_the_cpu_gives_the_same_bytes(alone):
    specs = [_CELLS[3], _CELLS[4]]
    assert run_packed(specs) == [alone[s] for s in specs]


@pytest.mark.slow
def test_the_same_bytes_with_busy_processes_beside(alone):
    """As above with a CPU-bound process on every core."""
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        for _ in range(3):
            assert _in_threads(_CELLS) == alone
        assert _fresh_process(list(_CELLS)) == alone
        assert run_packed([_CELLS[3], _CELLS[4]]) == [alone[_CELLS[3]], alone[_CELLS[4]]]
    finally:
        for p in busy:
            p.kill()
            p.wait()
