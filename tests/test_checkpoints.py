"""Checkpoints of the training loop: a run stopped between epochs and resumed in a fresh process's
model gives the bytes of the run never stopped, for every registered model and the reference
protocol's variants, eagerly and packed."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

from datasets import load_or_simulate, prepare
from nlmodels import build_model
from nlmodels.model_registry import model_names
from nltrain import (
    Checkpoints,
    LoopOptions,
    TrainingInterrupted,
    seeded,
    train,
    train_packed,
)
from nltrain._checkpoints import generator_states, restore_generators
from tasks.config import TrainConfig

#: The variants the reference protocol trains (tasks/profiles/paper.yaml), besides each model's
#: defaults: every option there that moves a random stream or a solve.
REFERENCE = {
    "node": {"start": "first_query", "adjoint": True},
    "latent_ode": {
        "z0_time": "first_query",
        "kl_average": "latents",
        "predict": "sample",
        "select": "val_loss",
    },
}
CASES = [(name, {}) for name in model_names()] + [(n, o) for n, o in REFERENCE.items()]
EPOCHS, STOP_AFTER = 4, 1


@pytest.fixture(scope="module")
def data():
    return prepare(load_or_simulate("integro_de", n_trajectories=40, seed=0), seed=0)


def _cfg(**kw) -> TrainConfig:
    base = {"epochs": EPOCHS, "patience": None, "batch_size": 16, "lr": 1e-2}
    return TrainConfig(**{**base, **kw})


def _model(name: str, options: dict, seed: int = 3):
    with seeded(seed):
        return build_model(name, 1, **options)


def _bytes(model) -> dict[str, bytes]:
    return {k: v.detach().cpu().numpy().tobytes() for k, v in model.state_dict().items()}


def _stop_after(epoch: int, stop: threading.Event):
    def on_epoch(record) -> None:
        if record.epoch == epoch:
            stop.set()

    return on_epoch


def _interrupted_then_resumed(name, options, data, store, step, config):
    """The run stopped after epoch STOP_AFTER, then resumed by a model built afresh."""
    stop = threading.Event()
    first = _model(name, options)
    with pytest.raises(TrainingInterrupted):
        train(
            first,
            data.train,
            data.val,
            config,
            label="cell",
            stop=stop,
            step=step,
            on_epoch=_stop_after(STOP_AFTER, stop),
            checkpoints=store,
        )
    seen: list[int] = []
    again = _model(name, options)
    result = train(
        again,
        data.train,
        data.val,
        config,
        label="cell",
        step=step,
        on_epoch=lambda r: seen.append(r.epoch),
        checkpoints=store,
    )
    return again, result, seen


@pytest.mark.parametrize(
    ("name", "options"),
    [
        pytest.param(
            n,
            o,
            id=f"{n}{'-ref' if o else ''}",
            # the two that train longest: the heavy tier
            marks=[pytest.mark.heavy] if not o and n in ("neural_dde", "nf_coupling") else [],
        )
        for n, o in CASES
    ],
)
def test_a_resumed_run_has_the_bytes_of_the_run_never_stopped(name, options, data, tmp_path):
    config = _cfg()
    straight = _model(name, options)
    expected = train(straight, data.train, data.val, config, label="cell")
    # saved only when stopped: the last whole epoch's state, written on the interruption
    store = Checkpoints(tmp_path, {"cell": "id"}, every_seconds=1e9)
    resumed, result, seen = _interrupted_then_resumed(name, options, data, store, "auto", config)
    assert [(r.train_loss, r.val_loss, r.val_rmse, r.nfe) for r in result.history] == [
        (r.train_loss, r.val_loss, r.val_rmse, r.nfe) for r in expected.history
    ]
    assert (result.best_epoch, result.stopped) == (expected.best_epoch, expected.stopped)
    assert _bytes(resumed) == _bytes(straight)
    assert seen == list(range(EPOCHS))  # the restored epochs told again, then the new ones


@pytest.mark.slow
@pytest.mark.parametrize("step", ["eager", "packed"])
@pytest.mark.parametrize(
    ("name", "options"), CASES, ids=[f"{n}{'-ref' if o else ''}" for n, o in CASES]
)
def test_each_step_resumes_to_the_bytes_of_its_run_never_stopped(
    name, options, step, data, tmp_path
):
    from nltrain import packable

    if step == "packed" and not packable(_model(name, options).double(), torch.device("cpu")):
        pytest.skip(f"{name} {options} does not pack")
    config = _cfg()
    straight = _model(name, options)
    expected = train(straight, data.train, data.val, config, label="cell", step=step)
    store = Checkpoints(tmp_path, {"cell": "id"}, every_seconds=0)
    resumed, result, _ = _interrupted_then_resumed(name, options, data, store, step, config)
    assert [r.val_rmse for r in result.history] == [r.val_rmse for r in expected.history]
    assert _bytes(resumed) == _bytes(straight)


def test_a_pack_resumes_to_the_bytes_of_the_pack_never_stopped(data, tmp_path):
    config = _cfg()
    seeds = [0, 1]

    def models():
        return [_model("node", {}, seed=s) for s in seeds]

    resumes: list[tuple[int, int]] = []

    def run(ms, store=None, stop=None, on_epoch=None):
        opts = LoopOptions(
            ("a", "b"), on_epoch, stop, checkpoints=store,
            on_resume=lambda m, epoch: resumes.append((m, epoch)),
        )  # fmt: skip
        return train_packed(ms, [data.train] * 2, [data.val] * 2, config, seeds=seeds, options=opts)

    straight = models()
    expected = run(straight)
    store = Checkpoints(tmp_path, {"a": "1", "b": "2"}, every_seconds=0)
    stop = threading.Event()
    with pytest.raises(TrainingInterrupted):
        run(models(), store, stop, lambda m, r: stop.set() if r.epoch == STOP_AFTER else None)
    again = models()
    assert resumes == []
    results = run(again, store)
    assert resumes == [(0, STOP_AFTER + 1), (1, STOP_AFTER + 1)]
    for got, want, m_got, m_want in zip(results, expected, again, straight, strict=True):
        assert got.history[-1].val_rmse == want.history[-1].val_rmse
        assert [r.train_loss for r in got.history] == [r.train_loss for r in want.history]
        assert _bytes(m_got) == _bytes(m_want)


def test_a_finished_run_is_kept_until_discarded_and_then_trains_again(data, tmp_path):
    store = Checkpoints(tmp_path, {"cell": "id"}, every_seconds=0)
    first = _model("node", {})
    done = train(first, data.train, data.val, _cfg(epochs=3), label="cell", checkpoints=store)
    seen: list[int] = []
    again = _model("node", {})
    kept = train(
        again,
        data.train,
        data.val,
        _cfg(epochs=3),
        label="cell",
        checkpoints=store,
        on_epoch=lambda r: seen.append(r.epoch),
    )
    assert kept == done and seen == [0, 1, 2]  # nothing trained: the kept result, retold
    assert _bytes(again) == _bytes(first) and not again.training
    assert store.discard(["cell"]) == 1 and not list(tmp_path.iterdir())
    assert store.discard(["cell"]) == 0


def _spin(seconds: float):
    """An ``on_epoch`` that computes for ``seconds`` of CPU time."""
    import time

    def on_epoch(record) -> None:
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass

    return on_epoch


def test_a_resumed_run_counts_the_seconds_spent_before_it_stopped(data, tmp_path):
    """Wall and CPU seconds go on from the checkpoint's: its first part computes more than
    the second takes in all, and the result holds both parts; a checkpoint written before the
    CPU time was kept resumes with that time unknown, its wall time still counted."""
    import time

    store = Checkpoints(tmp_path, {"cell": "id"}, every_seconds=0)
    busy, stop = _spin(0.5), threading.Event()

    def first_part(record) -> None:
        busy(record)
        _stop_after(STOP_AFTER, stop)(record)

    with pytest.raises(TrainingInterrupted):
        train(_model("node", {}), data.train, data.val, _cfg(), label="cell", stop=stop,
              on_epoch=first_part, checkpoints=store)  # fmt: skip
    saved = store.load(["cell"])
    assert saved["cpu_seconds"] >= 1.0 and saved["seconds"] >= 1.0  # two epochs' spins
    start = time.process_time()
    result = train(_model("node", {}), data.train, data.val, _cfg(), label="cell",
                   checkpoints=store)  # fmt: skip
    second = time.process_time() - start
    assert second < saved["cpu_seconds"]  # (without it the test could not tell)
    assert saved["cpu_seconds"] <= result.cpu_seconds <= saved["cpu_seconds"] + second
    assert result.seconds >= saved["seconds"]
    # the interrupted state again, as a checkpoint written before the CPU time was kept
    store.save(["cell"], {k: v for k, v in saved.items() if k != "cpu_seconds"})
    again = train(_model("node", {}), data.train, data.val, _cfg(), label="cell",
                  checkpoints=store)  # fmt: skip
    assert again.cpu_seconds is None and again.seconds >= saved["seconds"]
    assert [r.val_rmse for r in again.history] == [r.val_rmse for r in result.history]


def test_a_checkpoint_of_other_numerics_or_a_torn_file_is_not_resumed(data, tmp_path):
    config = _cfg(epochs=3)
    old = Checkpoints(tmp_path, {"cell": "numerics A"}, every_seconds=0)
    train(_model("node", {}), data.train, data.val, config, label="cell", checkpoints=old)
    new = Checkpoints(tmp_path, {"cell": "numerics B"}, every_seconds=0)
    assert new.load(["cell"]) is None  # another identity: another file
    (pt,) = tmp_path.glob("*.pt")
    pt.write_bytes(b"torn")
    with pytest.warns(RuntimeWarning, match="not resumed"):
        assert old.load(["cell"]) is None
    straight = train(_model("node", {}), data.train, data.val, config, label="x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        again = train(
            _model("node", {}), data.train, data.val, config, label="cell", checkpoints=old
        )
    assert [r.val_rmse for r in again.history] == [r.val_rmse for r in straight.history]


def test_a_loop_whose_labels_have_no_identity_keeps_no_checkpoint(data, tmp_path):
    store = Checkpoints(tmp_path, {"other": "id"}, every_seconds=0)
    train(_model("node", {}), data.train, data.val, _cfg(epochs=2), label="cell", checkpoints=store)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_every_seconds_must_not_be_negative_or_nan(tmp_path):
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="every_seconds"):
            Checkpoints(tmp_path, {}, every_seconds=bad)


def test_generator_streams_are_found_saved_and_put_back_including_unstarted_ones():
    model = _model("latent_ode", {"predict": "sample"})
    x = torch.zeros(2, 3, 1, dtype=torch.float64)
    model.double()._standard_normal(x)  # the ELBO stream starts; the prediction's not yet
    saved = generator_states(model)
    assert list(saved) == ["_sampler"]
    expected = model._standard_normal(x)
    fresh = _model("latent_ode", {"predict": "sample"}).double()
    fresh._prediction_z0(x, x + 1)  # a stream the saved model had not started
    restore_generators(fresh, saved)
    assert fresh._predictor is None
    assert torch.equal(fresh._standard_normal(x), expected)


def test_a_cell_stopped_mid_run_resumes_in_a_new_run_to_the_same_test_score(
    mlflow_store, tmp_path, monkeypatch
):
    from dataclasses import replace

    from cells import tiny_cell

    from nltrain import _checkpoints
    from tasks.cell import CellRuntime, run_cell
    from tasks.tracking import connect

    t = connect()
    cell = tiny_cell(0, training=TrainConfig(epochs=4, batch_size=8, patience=None))
    plain = CellRuntime.for_store(t.store, parent_run_id=None, profile="smoke", device="cpu")
    want = run_cell(cell, plain)
    stop = threading.Event()
    rt = replace(plain, checkpoints=tmp_path / "ck", checkpoint_minutes=0.0, stop=stop)
    save = _checkpoints.Checkpoints.save

    def save_then_stop(self, labels, state):
        path = save(self, labels, state)
        if state["epoch"] == STOP_AFTER:
            stop.set()  # as Ctrl-C would, after the third epoch's checkpoint
        return path

    monkeypatch.setattr(_checkpoints.Checkpoints, "save", save_then_stop)
    first = run_cell(cell, rt)
    assert first.status == "interrupted" and len(list((tmp_path / "ck").glob("*.pt"))) == 1
    monkeypatch.setattr(_checkpoints.Checkpoints, "save", save)
    stop.clear()
    again = run_cell(cell, rt)
    assert again.status == "finished" and again.test_rmse == want.test_rmse
    assert not list((tmp_path / "ck").glob("*"))  # kept in its run now: discarded
    history = t.store.client.get_metric_history(again.run_id, "val_rmse")
    assert [m.step for m in history] == list(range(4))  # the whole curve in the new run
    resumed_at = t.store.client.get_run(again.run_id).data.tags["nllab.resumed_at_epoch"]
    assert resumed_at == str(STOP_AFTER + 1)  # the first epoch it trained, for its pace


def test_ledger_status_names_the_runs_kept_beside_the_ledger(tmp_path, capsys):
    from flows.cli import main
    from flows.ledger import checkpoint_folder

    ledger = tmp_path / "ledger.jsonl"
    store = Checkpoints(checkpoint_folder(ledger), {"a/node/seed1": "x", "b/node/seed2": "y"})
    store.save(["a/node/seed1"], {"finished": False, "epoch": 411, "step": {}})
    store.save(["b/node/seed2"], {"finished": True, "cells": []})
    (store.folder / "stray.json").write_text("{not json")
    assert [(p.labels, p.epoch) for p in store.progress()] == [
        (("a/node/seed1",), 411),
        (("b/node/seed2",), None),
    ]
    args = ["ledger", "status", "--ledger", str(ledger), "--methods", "node", "--seeds", "1"]
    assert main([*args, "--no-ablation"]) == 0
    out = capsys.readouterr().out
    assert (
        f"2 training runs kept in {store.folder} (stopped before their record; `ledger run` "
        "resumes them): a/node/seed1 after 412 epochs; b/node/seed2 finished"
    ) in out
    assert store.discard(["a/node/seed1", "b/node/seed2"]) == 2 and not store.progress()


@pytest.mark.slow
def test_every_model_variant_the_ledger_trains_resumes_to_its_bytes(data, tmp_path):
    """The cases nobody listed: each distinct model setting of the ledger's cells (Table 3 by
    both protocols, the ablation, the peers and every study), stopped and resumed as above."""
    import json

    from flows.studies import ledger_study_cells
    from tasks.ledger import ledger_cell_configs

    variants: dict[tuple[str, str], dict] = {}
    for profile in ("paper", "fair"):
        cells = [c for c, _ in ledger_cell_configs(profile=profile)]
        cells += [c for _, _, c in ledger_study_cells(profile)]
        for c in cells:
            variants.setdefault((c.method, json.dumps(c.model, sort_keys=True)), dict(c.model))
    assert len(variants) >= 20  # every Table 3 method, the reference's options, the studies'
    config, differ = _cfg(), []
    for i, ((name, _), options) in enumerate(sorted(variants.items())):
        straight = _model(name, options)
        expected = train(straight, data.train, data.val, config, label="cell")
        store = Checkpoints(tmp_path / str(i), {"cell": "id"}, every_seconds=0)
        resumed, result, _ = _interrupted_then_resumed(name, options, data, store, "auto", config)
        same = [r.val_rmse for r in result.history] == [r.val_rmse for r in expected.history]
        if not (same and _bytes(resumed) == _bytes(straight)):
            differ.append(f"{name} {options}")
    assert differ == []


def test_cells_trained_one_by_one_resume_each_under_its_own_index(data, tmp_path):
    config, seeds = _cfg(), [0, 1]
    resumes: list[tuple[int, int]] = []

    def run(store=None, stop=None, on_epoch=None):
        ms = [_model("node", {}, seed=s) for s in seeds]
        opts = LoopOptions(
            ("a", "b"), on_epoch, stop, checkpoints=store,
            on_resume=lambda m, epoch: resumes.append((m, epoch)),
        )  # fmt: skip
        results = train_packed(
            ms, [data.train] * 2, [data.val] * 2, config, seeds=seeds, options=opts, pack=False
        )
        return results, ms

    expected, straight = run()
    store = Checkpoints(tmp_path, {"a": "1", "b": "2"}, every_seconds=0)
    stop = threading.Event()
    with pytest.raises(TrainingInterrupted):  # in the second cell's run: the first is finished
        run(store, stop, lambda m, r: stop.set() if (m, r.epoch) == (1, STOP_AFTER) else None)
    results, again = run(store)
    assert resumes == [(0, EPOCHS), (1, STOP_AFTER + 1)]  # the first kept whole, then the second
    for got, want, m_got, m_want in zip(results, expected, again, straight, strict=True):
        assert [r.val_rmse for r in got.history] == [r.val_rmse for r in want.history]
        assert _bytes(m_got) == _bytes(m_want)


def test_a_pack_resumes_after_one_of_its_cells_stopped_early(data, tmp_path):
    """Patience ends the members at different epochs (6, 8 and 10 epochs here): a checkpoint
    taken after the first stopped holds its result and the pack without it."""
    config, seeds = _cfg(epochs=12, patience=2, lr=0.1), [0, 1, 2]

    def run(store=None, stop=None, on_epoch=None):
        ms = [_model("node", {}, seed=s) for s in seeds]
        opts = LoopOptions(("a", "b", "c"), on_epoch, stop, checkpoints=store)
        results = train_packed(ms, [data.train] * 3, [data.val] * 3, config, seeds=seeds,
                               options=opts)  # fmt: skip
        return results, ms

    expected, straight = run()
    lengths = [len(r.history) for r in expected]
    assert lengths[0] < lengths[1] - 1 and expected[0].packed_members == 3  # stops apart
    store = Checkpoints(tmp_path, {"a": "1", "b": "2", "c": "3"}, every_seconds=1e9)
    stop = threading.Event()
    after = lengths[0]  # the epoch after the first cell's last: it has stopped, two train on
    with pytest.raises(TrainingInterrupted):
        run(store, stop, lambda m, r: stop.set() if (m, r.epoch) == (2, after) else None)
    assert [p.epoch for p in store.progress()] == [after]  # not the last epoch all three trained
    results, again = run(store)
    for got, want, m_got, m_want in zip(results, expected, again, straight, strict=True):
        assert [r.val_rmse for r in got.history] == [r.val_rmse for r in want.history]
        assert (got.best_epoch, got.stopped) == (want.best_epoch, want.stopped)
        assert _bytes(m_got) == _bytes(m_want)


_KILLED_CHILD = """
import sys
from pathlib import Path

from datasets import load_or_simulate, prepare
from nlmodels import build_model
from nltrain import Checkpoints, seeded, train
from tasks.config import TrainConfig

data = prepare(load_or_simulate("integro_de", n_trajectories=40, seed=0), seed=0)
with seeded(3):
    model = build_model("neural_laplace", 1)
config = TrainConfig.model_validate_json(sys.argv[2])  # the test's own
store = Checkpoints(Path(sys.argv[1]), {"cell": "id"}, every_seconds=0)
train(model, data.train, data.val, config, label="cell", checkpoints=store)
"""


@pytest.mark.heavy  # runs killed at many moments
def test_a_run_killed_at_random_moments_resumes_to_the_bytes_of_the_run_never_stopped(
    data, tmp_path
):
    """SIGKILL (no handler, no last save) at moments drawn at random, a checkpoint written
    every epoch: the files left are whole (written aside, then renamed), and the run resumed in
    another process ends with the bytes of the run never stopped."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    epochs = 40
    config = _cfg(epochs=epochs)
    straight = _model("neural_laplace", {})
    expected = train(straight, data.train, data.val, config, label="cell")
    draw = random.Random(os.getpid())  # moments nobody chose
    kept: list = []  # the epoch kept after each child
    for _ in range(2):
        before = Checkpoints(tmp_path).progress()
        child = subprocess.Popen(
            [sys.executable, "-c", _KILLED_CHILD, str(tmp_path), config.model_dump_json()],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 120
        while child.poll() is None and Checkpoints(tmp_path).progress() == before:
            assert time.monotonic() < deadline, "the child kept no checkpoint"
            time.sleep(0.01)  # until it trains: a checkpoint of its own
        time.sleep(draw.uniform(0.0, 0.3))
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        child.wait(60)
        assert child.returncode in (0, -signal.SIGKILL), child.stderr.read().decode()[-2000:]
        kept += [p.epoch for p in Checkpoints(tmp_path).progress()]
    store = Checkpoints(tmp_path, {"cell": "id"}, every_seconds=0)
    resumed = _model("neural_laplace", {})
    result = train(resumed, data.train, data.val, config, label="cell", checkpoints=store)
    assert [(r.train_loss, r.val_rmse) for r in result.history] == [
        (r.train_loss, r.val_rmse) for r in expected.history
    ]
    assert _bytes(resumed) == _bytes(straight)
    assert kept[0] is not None, "the first child finished before its kill"
    assert kept == sorted(kept, key=lambda e: epochs if e is None else e)  # each went further
