"""The training loop, without Prefect or MLflow."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from datasets import load_or_simulate, prepare
from nlmodels import ForecastModel, build_model
from nlmodels.base import batch_times
from nltrain import (
    TrainingDiverged,
    TrainingInterrupted,
    seeded,
    select_device,
    train,
)
from tasks.config import TrainConfig


class Linear(ForecastModel):
    """x(t_q) ≈ a · x(last observed) + b · t_q: learnable, tiny, deterministic."""

    def __init__(self, state_dim: int) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(state_dim))
        self.b = nn.Parameter(torch.randn(state_dim))

    def forward(self, obs_t, obs_x, query_t):
        self.count_nfe()
        qt = batch_times(query_t, obs_x.shape[0]).to(obs_x.dtype)
        return obs_x[:, -1:, :] * self.a + qt[..., None] * self.b * 0.1


class NaNModel(Linear):
    def forward(self, obs_t, obs_x, query_t):
        return super().forward(obs_t, obs_x, query_t) * float("nan")


@pytest.fixture(scope="module")
def data():
    return prepare(load_or_simulate("integro_de", n_trajectories=60, seed=0), seed=0)


def _cfg(**kw) -> TrainConfig:
    base = {"epochs": 20, "patience": None, "batch_size": 16, "lr": 0.05}
    return TrainConfig(**{**base, **kw})


def test_training_reduces_validation_error(data):
    torch.manual_seed(0)
    model = Linear(1)
    r = train(model, data.train, data.val, _cfg())
    assert len(r.history) == 20 and r.stopped == "epochs"
    assert r.history[-1].val_rmse < 0.7 * r.history[0].val_rmse
    assert r.history[-1].train_loss < r.history[0].train_loss
    assert all(h.nfe == 3 for h in r.history)  # 48 training trajectories / 16 = 3 batches
    assert r.best_val_rmse == min(h.val_rmse for h in r.history)
    # val_loss of an MSE model is the square of val RMSE
    assert r.history[0].val_loss == pytest.approx(r.history[0].val_rmse ** 2)
    assert next(model.parameters()).dtype == torch.float64


def test_early_stopping_waits_patience_epochs(data):
    torch.manual_seed(0)
    r = train(Linear(1), data.train, data.val, _cfg(lr=1e-300, patience=3))
    # Steps of 1e-300 leave float64 weights unchanged: only epoch 0 counts as an improvement,
    # so training stops after `patience` more epochs.
    assert r.stopped == "early_stopping"
    assert r.best_epoch == 0
    assert len(r.history) == 1 + 3


def test_best_validation_weights_are_restored(data):
    torch.manual_seed(1)
    model = Linear(1)
    snapshots = {}

    def sabotage(rec):
        snapshots[rec.epoch] = copy.deepcopy(model.state_dict())
        if rec.epoch == 4:  # wreck the weights: later epochs validate far worse
            with torch.no_grad():
                model.a.mul_(50.0)
                model.b.add_(30.0)

    r = train(model, data.train, data.val, _cfg(epochs=7, lr=1e-3), on_epoch=sabotage)
    assert r.history[5].val_rmse > r.history[4].val_rmse
    assert r.best_epoch <= 4
    for k, v in model.state_dict().items():
        assert torch.equal(v, snapshots[r.best_epoch][k])
    assert not torch.equal(model.a, snapshots[6]["a"])


def test_nan_loss_is_a_clear_failure(data):
    with pytest.raises(TrainingDiverged, match=r"training loss is nan at epoch 0, batch 0"):
        train(NaNModel(1), data.train, data.val, _cfg(), label="x")


def test_exploding_weights_are_a_clear_failure(data):
    torch.manual_seed(0)
    with pytest.raises(TrainingDiverged, match=r"diverged|gradient norm|validation RMSE"):
        train(Linear(1), data.train, data.val, _cfg(lr=1e300, grad_clip=None))


def test_stop_event_interrupts(data):
    stop = threading.Event()
    stop.set()
    with pytest.raises(TrainingInterrupted):
        train(Linear(1), data.train, data.val, _cfg(), stop=stop)


def test_the_cpu_seconds_leave_out_the_time_the_run_was_not_computing(data):
    """A run that waits 0.2 s after each of its 4 epochs, as when other work holds the core:
    the wall time counts the waits, the process's CPU time does not (what ``ledger status
    --time-left`` plans from, whatever the load a record was made under)."""
    import time

    torch.manual_seed(0)
    r = train(Linear(1), data.train, data.val, _cfg(epochs=4), on_epoch=lambda _: time.sleep(0.2))
    assert r.seconds >= 0.8
    assert r.cpu_seconds is not None and 0 < r.cpu_seconds < r.seconds - 0.7


def test_time_budget_stops_training(data):
    r = train(Linear(1), data.train, data.val, _cfg(epochs=500, max_train_seconds=1e-6))
    assert r.stopped == "time_budget" and len(r.history) == 1


def test_a_budget_stopped_run_is_replayed_by_its_epoch_count(data, monkeypatch):
    """A time budget only truncates: the same cell trained for the epochs the budget allowed,
    without a budget, ends with the same history and weights."""
    import nltrain._loop

    class Clock:  # one second per call: the budget ends the run after a few epochs
        now = 0.0

        @classmethod
        def perf_counter(cls) -> float:
            cls.now += 1.0
            return cls.now

        @staticmethod
        def process_time() -> float:
            return 0.0

    def run(cfg):
        with seeded(4):
            m = Linear(1)
        r = train(m, data.train, data.val, cfg, seed=4)
        return r, m.state_dict()

    monkeypatch.setattr(nltrain._loop, "time", Clock)
    budgeted, w_budget = run(_cfg(epochs=500, patience=None, max_train_seconds=9.0))
    monkeypatch.undo()
    assert budgeted.stopped == "time_budget" and 1 < len(budgeted.history) < 500
    replay, w_replay = run(_cfg(epochs=len(budgeted.history), patience=None))
    assert replay.stopped == "epochs" and replay.best_epoch == budgeted.best_epoch
    assert [e.val_rmse for e in replay.history] == [e.val_rmse for e in budgeted.history]
    for k in w_budget:
        assert torch.equal(w_budget[k], w_replay[k])


def test_same_seed_same_model(data):
    def run(seed):
        with seeded(seed):
            m = Linear(1)
        train(m, data.train, data.val, _cfg(epochs=3), seed=seed)
        return torch.cat([p.detach().flatten() for p in m.parameters()])

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))


def test_device_selection():
    assert select_device("cpu").type == "cpu"
    assert select_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="valid devices: auto, cpu, cuda"):
        select_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match=r"CUDA is not available.*--device cpu"):
            select_device("cuda")


def test_neural_laplace_learns_a_little(data):
    with seeded(0):
        model = build_model("neural_laplace", 1)
    r = train(model, data.train, data.val, _cfg(epochs=4, lr=1e-2))
    assert r.history[-1].train_loss < r.history[0].train_loss
    assert r.history[0].nfe > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_on_cuda(data):
    with seeded(0):
        model = build_model("neural_laplace", 1)
    r = train(model, data.train, data.val, _cfg(epochs=3, lr=1e-2), device="cuda")
    assert next(model.parameters()).device.type == "cuda"
    assert r.history[-1].train_loss < r.history[0].train_loss


def test_the_epoch_bar_names_a_time_budget_instead_of_an_eta():
    from nltrain._loop import epoch_bar

    plain = epoch_bar(_cfg(epochs=30), "cell", progress=True)
    budgeted = epoch_bar(_cfg(epochs=1000, max_train_seconds=25.0), "cell", progress=True)
    packed = epoch_bar(_cfg(epochs=5, max_train_seconds=25.0), "cell", True, budget=75.0)
    try:
        assert plain.total == 30 and plain.desc == "cell"
        assert budgeted.total is None and budgeted.desc == "cell (budget 25 s)"  # no ETA
        assert list(budgeted) == list(range(1000))
        assert packed.desc == "cell (budget 75 s)"
    finally:
        for bar in (plain, budgeted, packed):
            bar.close()


def _history(*val_rmse: float):
    from nltrain import EpochRecord

    return [EpochRecord(e, 1.0, 1.0, v, 0.5, 0) for e, v in enumerate(val_rmse)]


def test_stop_reason_names_each_reason_and_none():
    from nltrain import stop_reason

    cfg = _cfg(epochs=5, patience=2)
    assert stop_reason([], cfg) is None
    assert stop_reason(_history(3.0, 2.0, 2.5), cfg) is None  # best at 1, one epoch since
    assert stop_reason(_history(3.0, 2.0, 2.5, 2.0), cfg) == "early_stopping"  # a tie is no gain
    assert stop_reason(_history(3.0, 2.0, 1.0, 0.5, 0.4), cfg) == "epochs"
    assert stop_reason(_history(3.0, 2.0, 1.0), cfg.fixed_epochs(3)) == "epochs"
    budgeted = _cfg(epochs=5, patience=None, max_train_seconds=10.0)
    assert stop_reason(_history(3.0), budgeted, elapsed=9.9) is None
    assert stop_reason(_history(3.0), budgeted, elapsed=10.0) == "time_budget"
    # a pack's budget (M cells: M times the cell's) replaces the config's
    assert stop_reason(_history(3.0), budgeted, elapsed=10.0, budget=20.0) is None
    assert stop_reason(_history(3.0), _cfg(epochs=5), elapsed=1e9, budget=20.0) == "time_budget"
    # early stopping before the budget, the budget before the epoch ceiling
    both = _cfg(epochs=3, patience=1, max_train_seconds=1.0)
    assert stop_reason(_history(1.0, 2.0), both, elapsed=5.0) == "early_stopping"
    assert stop_reason(_history(2.0, 1.0, 0.5), both, elapsed=5.0) == "time_budget"


def test_fixed_epochs_switches_off_every_other_stop():
    cfg = _cfg(epochs=500, patience=3, max_train_seconds=2.0)
    fixed = cfg.fixed_epochs(7)
    assert (fixed.epochs, fixed.patience, fixed.max_train_seconds) == (7, None, None)
    assert fixed.lr == cfg.lr and fixed.batch_size == cfg.batch_size
    assert cfg.fixed_epochs().epochs == 500


def test_both_step_kinds_declare_the_step_function(data):
    from nltrain import StepFunction, step_function
    from nltrain._packed_cells import pack_of_one

    with seeded(0):
        model = build_model("node", 1, hidden=(4,))
    cfg = _cfg(epochs=1)
    eager = step_function(model, data.train, data.val, cfg, step="eager")
    packed = pack_of_one(model, data.train, data.val, cfg, torch.device("cpu"), 0, "x")
    assert type(eager).__name__ == "_EagerCell" and type(packed).__name__ == "PackedCells"
    for step in (eager, packed):
        assert isinstance(step, StepFunction)
        assert step.n_train == len(data.train.obs_x) and step.members == [0]
    # a step missing one member is not one
    kept = ("graphs_used", "begin_epoch", "train_step", "end_epoch", "keep_best", "diverged")
    no_drop = copy.copy(eager)
    no_drop.__class__ = type("NoDrop", (), {k: getattr(type(eager), k) for k in kept})
    assert isinstance(eager, StepFunction) and not isinstance(no_drop, StepFunction)


def test_epoch_seconds_times_the_training_loop(data):
    from nltrain import epoch_seconds

    with seeded(0):
        model = Linear(1)
    cfg = _cfg(epochs=3, patience=1, batch_size=16)
    seconds, nfe = epoch_seconds(model, data.train, data.val, cfg)
    # Linear counts one evaluation per forward: one per training batch, validation apart
    assert seconds > 0 and nfe == 1.0


class _ScriptedStep:
    """A step function whose epochs are scripted: member m's validation RMSE at each epoch
    (None: its loss is NaN in that epoch's first batch)."""

    graphs_used = False
    n_train = 10

    def __init__(self, scripts: list[list[float | None]]) -> None:
        self.scripts, self.members, self.epoch = scripts, list(range(len(scripts))), -1
        self.steps, self.dropped, self.finished = 0, [], {}

    def begin_epoch(self) -> None:
        self.epoch += 1

    def train_step(self, b_i: int, start: int, batch: int) -> None:
        self.steps += 1

    def end_epoch(self):
        from nltrain._steps import Readout

        vals = [self.scripts[m][self.epoch] for m in self.members]
        ok = [v is not None for v in vals]
        k = len(vals)
        return Readout(ok, [5.0] * k, [0 if a else 1 for a in ok],
                       [0.0 if a else float("nan") for a in ok], [0] * k, [1.0] * k,
                       [v if v is not None else 0.0 for v in vals], [7] * k)  # fmt: skip

    def keep_best(self, j: int) -> dict:
        return {"epoch": self.epoch}

    def diverged(self, j: int) -> None:
        pass

    def finish(self, j: int, best_state: dict, nfe: int) -> None:
        self.finished[self.members[j]] = best_state

    def drop(self, keep: list[int]) -> None:
        self.dropped.append(list(keep))
        self.members = [self.members[j] for j in keep]


def test_train_loop_drives_any_step_function():
    from nltrain import LoopOptions, StepFunction, TrainResult, train_loop

    step = _ScriptedStep([[3.0, 2.0, 2.5, 2.6, 9.0], [3.0, None, 1.0, 1.0, 1.0], [3.0] * 5])
    assert isinstance(step, StepFunction)
    seen = []
    options = LoopOptions(("a", "b", "c"), on_epoch=lambda m, r: seen.append((m, r.epoch)))
    a, b, c = train_loop(step, _cfg(epochs=5, patience=2, batch_size=4), options)
    assert isinstance(a, TrainResult) and a.stopped == "early_stopping"
    assert (a.best_epoch, a.best_val_rmse, len(a.history)) == (1, 2.0, 4)
    assert a.history[0].train_loss == 5.0 / 10 and a.packed_members == 3
    assert isinstance(b, TrainingDiverged) and "b: training loss is nan at epoch 1" in str(b)
    assert isinstance(c, TrainResult) and c.stopped == "early_stopping" and c.best_epoch == 0
    assert step.finished == {0: {"epoch": 1}, 2: {"epoch": 0}}
    # b leaves after epoch 1 (positions 0, 2 kept), c after epoch 2 (position 0: a), a at 3
    assert step.dropped == [[0, 2], [0]]
    assert seen == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (0, 2), (2, 2), (0, 3)]
    assert step.steps == 3 * 4  # ceil(10 / 4) batches an epoch, no fifth epoch
