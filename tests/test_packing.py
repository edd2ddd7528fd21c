"""Packed training: each member of a pack trains exactly as its own unpacked run."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch
from torch import nn
from torchdiffeq import odeint

from datasets import SplitData
from nlmodels import build_model
from nlmodels.accel import plain_formulas
from nlmodels.base import host_bool, recorded_host_bools
from nlmodels.baselines._euler import euler_steps
from nltrain import (
    LoopOptions,
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    packable,
    predict,
    seeded,
    train,
    train_packed,
)
from nltrain._packed_gru import PlainGRUCell
from tasks.config import TrainConfig

# Small sizes keep every model fast; the architectures are the paper's.
_SMALL = {
    "neural_laplace": {"encoder_units": 6, "laplace_units": 12, "terms": 9},
    "node": {"hidden": (16, 16)},
    "anode": {"hidden": (16, 16)},
    "nf_coupling": {"encoder_units": 8, "hidden": (8, 8)},
    "nf_resnet": {"encoder_units": 8, "hidden": (8, 8)},
}
PACKABLE = tuple(_SMALL)
BASELINES = tuple(n for n in _SMALL if n != "neural_laplace")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny tensors: threads only add synchronisation (and contend on a shared machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _split(
    seed: int, n: int, *, t_o: int = 6, t_q: int = 6, dim: int = 2, t_end: float = 3.0
) -> SplitData:
    """Damped oscillations with random phase and rate, in the shapes of ``datasets.prepare``."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, t_end, t_o + t_q)
    phase = rng.uniform(0, 2 * np.pi, (n, 1, dim))
    rate = rng.uniform(0.1, 0.5, (n, 1, dim))
    x = np.exp(-rate * t[None, :, None]) * np.sin(2 * t[None, :, None] + phase)
    x = x + 0.01 * rng.standard_normal(x.shape)
    return SplitData.from_trajectories(t, x, t_o)


def _data(seed: int, **grid) -> tuple[SplitData, SplitData, SplitData]:
    return tuple(_split(base + seed, n, **grid) for base, n in ((100, 16), (200, 6), (300, 6)))


def _model(name: str, seed: int, **kw):
    with seeded(seed):
        return build_model(name, 2, **{**_SMALL.get(name, {}), **kw})


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"epochs": 4, "patience": None, "batch_size": 8, "lr": 0.01, **kw})


def _unpacked(name, seeds, cfg, datas, **kw):
    """Each cell trained alone; on the plain formulas (those a pack runs under vmap)."""
    out = []
    for s, (tr, va, _) in zip(seeds, datas):
        model = _model(name, s, **kw)
        try:
            with plain_formulas():
                result = train(model, tr, va, cfg, seed=s, label=f"m{s}")
        except TrainingDiverged as e:
            result = e
        out.append((model, result))
    return out


def _packed(name, seeds, cfg, datas, *, on_epoch=None, device="cpu", budget=None, **kw):
    models = [_model(name, s, **kw) for s in seeds]
    records = {i: [] for i in range(len(seeds))}

    def record(i, r):
        records[i].append(r)
        if on_epoch is not None:
            on_epoch(i, r)

    results = train_packed(
        models,
        [d[0] for d in datas],
        [d[1] for d in datas],
        cfg,
        device=device,
        seeds=seeds,
        options=LoopOptions(tuple(f"m{s}" for s in seeds), on_epoch=record, budget=budget),
    )
    for i, r in enumerate(results):
        if isinstance(r, TrainResult):
            assert list(r.history) == records[i]
    return list(zip(models, results))


def _assert_same(a, b, test: SplitData) -> None:
    (ma, ra), (mb, rb) = a, b
    if isinstance(ra, TrainingDiverged):
        assert isinstance(rb, TrainingDiverged) and str(ra) == str(rb)
    else:
        assert isinstance(rb, TrainResult)
        assert (ra.best_epoch, ra.stopped, len(ra.history)) == (
            rb.best_epoch,
            rb.stopped,
            len(rb.history),
        )
        for ea, eb in zip(ra.history, rb.history):
            assert ea.epoch == eb.epoch and ea.nfe == eb.nfe
            for f in ("train_loss", "val_loss", "val_rmse"):
                assert getattr(ea, f) == pytest.approx(getattr(eb, f), rel=0, abs=1e-8)
        assert rb.best_val_rmse == pytest.approx(ra.best_val_rmse, rel=0, abs=1e-8)
    with plain_formulas():
        np.testing.assert_allclose(predict(mb, test), predict(ma, test), rtol=0, atol=1e-8)
    for (na, ta), (nb, tb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert na == nb
        torch.testing.assert_close(tb, ta, rtol=0, atol=1e-8, equal_nan=True)
    assert ma.training == mb.training


@pytest.mark.training
@pytest.mark.parametrize("name", PACKABLE)
def test_packed_equals_unpacked_with_early_stopping(name):
    seeds = [0, 1, 2]
    datas = [_data(s) for s in seeds]
    cfg = _cfg(epochs=5, patience=1, lr=0.05)
    unpacked = _unpacked(name, seeds, cfg, datas)
    packed = _packed(name, seeds, cfg, datas)
    assert all(r.packed_members == 3 for _, r in packed)
    for a, b, d in zip(unpacked, packed, datas):
        _assert_same(a, b, d[2])
    # the pack exercised members that stop at different epochs
    lengths = {len(r.history) for _, r in unpacked}
    stops = {r.stopped for _, r in unpacked}
    if name in ("node", "nf_coupling"):
        assert len(lengths) > 1 and "early_stopping" in stops, (lengths, stops)


def _poisoned(split: SplitData, field: str) -> SplitData:
    x = np.array(getattr(split, field))
    x[3, -1, 0] = np.nan  # the last observation: the ODE models start from it
    return dataclasses.replace(split, **{field: x})


@pytest.mark.parametrize(
    ("where", "grad_clip", "expected"),
    [
        ("train", 1.0, "training loss is nan at epoch 0"),
        ("train", None, "training loss is nan at epoch 0"),
        ("val", 1.0, "validation RMSE is nan at epoch 0"),
    ],
)
def test_a_diverging_member_leaves_the_others_unchanged(where, grad_clip, expected):
    seeds = [0, 1, 2]
    datas = [_data(s) for s in seeds]
    tr, va, te = datas[1]
    datas[1] = (
        (_poisoned(tr, "obs_x"), va, te) if where == "train" else (tr, _poisoned(va, "target"), te)
    )
    cfg = _cfg(epochs=3, grad_clip=grad_clip)
    unpacked = _unpacked("node", seeds, cfg, datas)
    packed = _packed("node", seeds, cfg, datas)
    assert isinstance(packed[1][1], TrainingDiverged) and expected in str(packed[1][1])
    for a, b, d in zip(unpacked, packed, datas):
        _assert_same(a, b, d[2])


def test_gradient_norm_divergence_ends_only_that_member():
    # A vector field that is finite at the data but whose gradient overflows for one member.
    seeds = [0, 1]
    datas = [_data(s) for s in seeds]
    cfg = _cfg(epochs=2)

    def build(s):
        model = _model("node", s)
        if s == 1:
            with torch.no_grad():
                model.field[0].weight.mul_(1e200)
        return model

    unpacked = []
    for s, (tr, va, _) in zip(seeds, datas):
        m = build(s)
        try:
            unpacked.append((m, train(m, tr, va, cfg, seed=s, label=f"m{s}")))
        except TrainingDiverged as e:
            unpacked.append((m, e))
    models = [build(s) for s in seeds]
    results = train_packed(
        models,
        [d[0] for d in datas],
        [d[1] for d in datas],
        cfg,
        seeds=seeds,
        options=LoopOptions(labels=("m0", "m1")),
    )
    assert isinstance(results[1], TrainingDiverged)
    for a, b, d in zip(unpacked, zip(models, results), datas):
        _assert_same(a, b, d[2])


def test_result_does_not_depend_on_pack_composition():
    seeds = [0, 1, 2]
    datas = {s: _data(s) for s in seeds}
    cfg = _cfg(epochs=3, patience=1, lr=0.05)

    def member_a(order):
        out = _packed("node", order, cfg, [datas[s] for s in order])
        return out[order.index(0)]

    alone, full, pair = member_a([0]), member_a([0, 1, 2]), member_a([2, 0])
    assert alone[1].packed_members == 1 and pair[1].packed_members == 2
    _assert_same(alone, full, datas[0][2])
    _assert_same(alone, pair, datas[0][2])


@pytest.mark.parametrize("where", ["none", "train"])
def test_neural_laplace_packed_equals_unpacked(where):
    """Neural Laplace's plain formulas under vmap (its GRU encoder in plain ops) against each
    cell trained alone on the same formulas; a diverging member ends alone."""
    seeds = [0, 1, 2]
    datas = [_data(s) for s in seeds]
    if where == "train":
        tr, va, te = datas[1]
        datas[1] = (_poisoned(tr, "obs_x"), va, te)
    cfg = _cfg(epochs=3, patience=1, lr=0.02)
    unpacked = _unpacked("neural_laplace", seeds, cfg, datas)
    packed = _packed("neural_laplace", seeds, cfg, datas)
    assert all(isinstance(r, TrainingDiverged) or r.packed_members == 3 for _, r in packed)
    assert isinstance(packed[1][1], TrainingDiverged) == (where == "train")
    for a, b, d in zip(unpacked, packed, datas):
        _assert_same(a, b, d[2])


def test_neural_laplace_plain_formulas_match_the_native_path():
    """What a pack computes (plain formulas) is what an unpacked cell computes by default (the
    fused decoder and the native or wavefront GRU), to rounding."""
    tr, _, te = _data(0)
    cfg = _cfg(epochs=2)
    runs = []
    for plain in (False, True):
        model = _model("neural_laplace", 0)
        if plain:
            with plain_formulas():
                runs.append((model, train(model, tr, te, cfg, seed=0)))
        else:
            runs.append((model, train(model, tr, te, cfg, seed=0)))
    _assert_same(runs[0], runs[1], te)


@pytest.mark.parametrize("name", ["node", "neural_laplace"])
def test_cross_system_pack_gives_each_cell_its_unpacked_result(name):
    """Cells of other systems (other time grids, same shapes) pack together; each member
    trains on its own grid as it would alone, and does not depend on its pack-mates."""
    seeds = [0, 1, 2]
    datas = [_data(s, t_end=t_end) for s, t_end in zip(seeds, (3.0, 5.0, 2.0))]
    cfg = _cfg(epochs=3, patience=1, lr=0.05)
    unpacked = _unpacked(name, seeds, cfg, datas)
    packed = _packed(name, seeds, cfg, datas)
    assert all(r.packed_members == 3 for _, r in packed)
    for a, b, d in zip(unpacked, packed, datas):
        _assert_same(a, b, d[2])
    shared = _packed(name, [0, 3], cfg, [datas[0], _data(3)])  # with a same-grid mate
    _assert_same(packed[0], shared[0], datas[0][2])


def test_members_whose_train_and_val_grids_differ_train_one_by_one():
    seeds = [0, 1]
    datas = [_data(0), (_data(1)[0], _data(1, t_end=4.0)[1], _data(1)[2])]
    results = train_packed(
        [_model("node", s) for s in seeds],
        [d[0] for d in datas],
        [d[1] for d in datas],
        _cfg(epochs=1),
        seeds=seeds,
    )
    assert [r.packed_members for r in results] == [1, 1]
    same = _packed("node", seeds, _cfg(epochs=1), [_data(0)] * 2)
    assert [r.packed_members for _, r in same] == [2, 2]


def test_pack_false_trains_one_by_one():
    datas = [_data(s) for s in (0, 1)]
    results = train_packed(
        [_model("node", s) for s in (0, 1)],
        [d[0] for d in datas],
        [d[1] for d in datas],
        _cfg(epochs=1),
        seeds=[0, 1],
        pack=False,
    )
    assert [r.packed_members for r in results] == [1, 1]


@pytest.mark.parametrize("name", ["neural_laplace", "node"])
def test_a_single_cell_as_a_pack_of_one_equals_train(name):
    """The step train() runs for one cell on CUDA (a pack of one, graph-captured there), run on
    the CPU through the same training loop: the cell's result is that of its eager step."""
    tr, va, te = _data(0)
    cfg = _cfg(epochs=4, patience=1, lr=0.05)
    (eager,) = _unpacked(name, [0], cfg, [(tr, va, te)])
    model = _model(name, 0).double()
    result = train(model, tr, va, cfg, seed=0, label="m0", step="packed")
    assert result.packed_members == 1 and not result.graphs
    _assert_same(eager, (model, result), te)


def test_a_pack_of_one_is_refused_for_a_model_that_cannot_pack():
    tr, va, _ = _data(0)
    model = _model("node", 0, solver="dopri5").double()  # adaptive steps: not packable
    with pytest.raises(ValueError, match="cannot train as a pack of one"):
        train(model, tr, va, _cfg(epochs=1), step="packed")
    with pytest.raises(ValueError, match="unknown step"):
        train(model, tr, va, _cfg(epochs=1), step="graph")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_single_neural_laplace_cell_on_cuda_is_graphed():
    tr, va, te = _data(0)
    cfg = _cfg(epochs=4, patience=1, lr=0.05)
    (cpu,) = _unpacked("neural_laplace", [0], cfg, [(tr, va, te)])
    model = _model("neural_laplace", 0)
    result = train(model, tr, va, cfg, device="cuda", seed=0, label="m0")
    assert result.graphs and result.packed_members == 1
    _assert_same(cpu, (model.cpu(), result), te)


def test_packable():
    cpu = torch.device("cpu")
    assert packable(build_model("node", 1), cpu)
    assert packable(build_model("nf_resnet", 1), cpu)
    assert not packable(build_model("node", 1, solver="dopri5"), cpu)
    assert not packable(build_model("node", 1, adjoint=True), cpu)
    assert packable(build_model("latent_ode", 1), cpu)  # packs itself (tests/test_latent_pack.py)
    assert not packable(build_model("latent_ode", 1, adjoint=True), cpu)
    assert packable(build_model("neural_laplace", 1), cpu)  # its plain formulas under vmap
    assert not packable(build_model("neural_laplace", 1, encoder_units=4).float(), "meta")


def test_not_packable_models_fall_back_to_train():
    seeds = [0, 1]
    datas = [_data(s) for s in seeds]
    cfg = _cfg(epochs=2)
    kw = {"solver": "rk4"}
    unpacked = _unpacked("node", seeds, cfg, datas, **kw)
    packed = _packed("node", seeds, cfg, datas, **kw)
    assert all(r.packed_members == 1 for _, r in packed)
    for a, b, d in zip(unpacked, packed, datas):
        _assert_same(a, b, d[2])


def test_stop_event_interrupts():
    stop = threading.Event()
    stop.set()
    datas = [_data(s) for s in (0, 1)]
    # the error names every member of the pack: each member's KILLED run names its own seed
    with pytest.raises(TrainingInterrupted, match="node/seed0, node/seed1: stopped at epoch"):
        train_packed(
            [_model("node", 0), _model("node", 1)],
            [d[0] for d in datas],
            [d[1] for d in datas],
            _cfg(),
            seeds=[0, 1],
            options=LoopOptions(labels=("node/seed0", "node/seed1"), stop=stop),
        )


def test_mismatched_arguments_are_rejected():
    d = _data(0)
    with pytest.raises(ValueError, match="one train split, val split and seed per model"):
        train_packed([_model("node", 0)], [d[0]], [d[1]], _cfg(), seeds=[0, 1])
    with pytest.raises(ValueError, match="graphs=True needs a CUDA device"):
        train_packed([_model("node", 0)], [d[0]], [d[1]], _cfg(), seeds=[0], graphs=True)


def test_gru_cell_matches_torch_exactly():
    torch.manual_seed(0)
    cell = nn.GRUCell(3, 5).double()
    x, h = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    assert torch.equal(PlainGRUCell(cell)(x, h), cell(x, h))


def test_euler_matches_torchdiffeq_exactly():
    torch.manual_seed(0)
    w = torch.randn(3, 3, dtype=torch.float64)

    def field(t, x):
        return torch.tanh(x @ w) * t

    x0 = torch.randn(5, 3, dtype=torch.float64)
    times = torch.linspace(0.3, 2.0, 17, dtype=torch.float64) ** 2
    assert torch.equal(euler_steps(field, x0, times), odeint(field, x0, times, method="euler"))


def test_host_bools_are_replayed_without_reading_tensors():
    tape: list[bool] = []
    with recorded_host_bools(tape, replay=False):
        assert host_bool(torch.tensor(True)) and not host_bool(torch.tensor(0.0))
    assert tape == [True, False]
    with recorded_host_bools(tape, replay=True):
        # the replayed values, whatever the tensors now hold
        assert host_bool(torch.tensor(False)) and not host_bool(torch.tensor(1.0))
    assert host_bool(torch.tensor(1.0))


def test_host_bools_under_vmap_take_the_members_common_value():
    from torch.func import vmap

    seen = []

    def check(t):
        seen.append(host_bool((t > 0).all()))
        return t

    vmap(check)(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # members that agree
    vmap(check)(torch.tensor([[-1.0, 2.0], [-3.0, 4.0]]))
    assert seen == [True, False]
    with pytest.raises(ValueError, match="differs between packed members"):
        vmap(lambda t: host_bool((t > 0).all()) and t)(torch.tensor([[1.0, 2.0], [-3.0, 4.0]]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", PACKABLE)
def test_cuda_graphs_equal_eager(name):
    seeds = [0, 1, 2]
    datas = [_data(s) for s in seeds]
    datas[2] = (_poisoned(datas[2][0], "obs_x"), *datas[2][1:])  # one member diverges
    cfg = _cfg(epochs=5, patience=1, lr=0.05)
    runs = []
    for graphs in (False, True):
        models = [_model(name, s) for s in seeds]
        results = train_packed(
            models,
            [d[0] for d in datas],
            [d[1] for d in datas],
            cfg,
            device="cuda",
            seeds=seeds,
            graphs=graphs,
        )
        runs.append((models, results))
    (m_e, r_e), (m_g, r_g) = runs
    assert isinstance(r_g[2], TrainingDiverged) and str(r_g[2]) == str(r_e[2])
    for a, b in zip(r_e[:2], r_g[:2]):
        assert b.graphs and not a.graphs
        assert (a.best_epoch, a.stopped) == (b.best_epoch, b.stopped)
        for ea, eb in zip(a.history, b.history, strict=True):
            assert ea.nfe == eb.nfe
            assert abs(ea.train_loss - eb.train_loss) <= 1e-10
            assert abs(ea.val_rmse - eb.val_rmse) <= 1e-10
    for a, b in zip(m_e, m_g):
        for ta, tb in zip(a.state_dict().values(), b.state_dict().values()):
            torch.testing.assert_close(tb, ta, rtol=0, atol=1e-10, equal_nan=True)


@pytest.mark.parametrize("name", ["nf_resnet", "neural_laplace"])
def test_device_scalar_adam_and_replayed_checks_match_the_eager_step(name):
    """The arithmetic a CUDA graph replays (Adam's step size read from device scalars, the
    models' host checks replayed from a tape) against the CPU step, run on the CPU."""
    from nltrain._packer import Packer
    from nltrain._steps import Tensors

    datas = [_data(s) for s in (0, 1)]

    def run(device_scalars: bool, tape_mode: str) -> list[torch.Tensor]:
        models = [_model(name, s).double() for s in (0, 1)]
        data = {
            i: (Tensors.of(d[0], torch.device("cpu"), torch.float64),) * 2
            for i, d in enumerate(datas)
        }
        first = data[0][0]
        packer = Packer(models, torch.device("cpu"), 1.0, 0.01, first.obs_t, first.query_t)
        packer.device_scalars = device_scalars
        pack = packer.pack([0, 1], data)
        packer.set_mode(pack, True)
        tape: list[bool] = []
        for n_step in range(1, 4):
            idx = (torch.stack([torch.arange(8), torch.arange(8, 16)]) + n_step) % 16
            adam = packer.adam_scalars(n_step)
            if tape_mode == "none":
                packer.step(pack, idx, 8, adam)
            else:
                with recorded_host_bools(tape, replay=n_step > 1):
                    packer.step(pack, idx, 8, adam)
        if tape_mode != "none":
            assert tape and all(tape)  # the time-grid checks were recorded, then replayed
        return [t.detach().clone() for t in pack.mutable()] + [
            b.clone() for m in models for b in m.buffers()
        ]

    reference = run(False, "none")
    for got in (run(True, "none"), run(False, "tape")):
        for a, b in zip(reference, got, strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-12)


def test_members_with_different_settings_train_one_by_one():
    datas = [_data(s) for s in (0, 1)]
    models = [_model("node", 0), _model("node", 1, rtol=0.1)]  # same tensors, other settings
    results = train_packed(
        models, [d[0] for d in datas], [d[1] for d in datas], _cfg(epochs=1), seeds=[0, 1]
    )
    assert [r.packed_members for r in results] == [1, 1]


def test_the_time_budget_is_per_cell(monkeypatch):
    """A pack of M cells holds its worker for up to M budgets: on a clock where one packed
    epoch costs what one unpacked epoch does, each member runs M times the epochs. A budget
    given in the loop's options is the whole call's."""
    import nltrain._loop

    class Clock:  # advances one second per (packed) epoch, when the first member reports
        now = 0.0

        @classmethod
        def perf_counter(cls) -> float:
            return cls.now

        @staticmethod
        def process_time() -> float:
            return 0.0

        @classmethod
        def tick(cls, member: int, _record) -> None:
            cls.now += member == 0

    monkeypatch.setattr(nltrain._loop, "time", Clock)  # the training loop's clock
    cfg = _cfg(epochs=100, max_train_seconds=4.0)

    def epochs_run(seeds: list[int], budget: float | None = None) -> list[int]:
        Clock.now = 0.0
        datas = [_data(s) for s in seeds]
        results = [
            r for _, r in _packed("node", seeds, cfg, datas, on_epoch=Clock.tick, budget=budget)
        ]
        assert all(r.stopped == "time_budget" for r in results), [r.stopped for r in results]
        return [len(r.history) for r in results]

    assert epochs_run([0]) == [4]
    assert epochs_run([0, 1, 2]) == [12, 12, 12]
    assert epochs_run([0, 1, 2], budget=6.0) == [6, 6, 6]


@pytest.mark.slow
def test_cells_of_two_systems_pack_and_keep_their_results(mlflow_store):
    """The engine's pack key groups cells of other systems with data of the same shapes; the
    pack trains them together, and each cell's test RMSE is that of its run alone."""
    import tasks.cell as cell_module
    from tasks.cell import CellRuntime, pack_key, run_pack
    from tasks.config import CellConfig
    from tasks.tracking import connect

    training = _cfg(epochs=2, patience=None)
    cells = [
        CellConfig(
            system=system, method="node", seed=seed, data={"n_trajectories": 30}, training=training
        )
        for system, seed in (("integro_de", 0), ("sine", 1))
    ]
    assert pack_key(cells[0]) == pack_key(cells[1])
    t = connect()
    rt = CellRuntime.for_store(t.store, parent_run_id=None, profile="smoke", device="cpu")
    results = run_pack(cells, rt)
    assert [r.status for r in results] == ["finished", "finished"]
    runs = t.store.client.search_runs([t.experiment_id], "tags.`nllab.kind` = 'cell'")
    assert {r.data.tags["system"]: r.data.tags["packed_members"] for r in runs} == {
        "integro_de": "2",
        "sine": "2",
    }
    for i in (0, 1):
        alone = cell_module._train_pack([cells[i]], rt)[0]  # trained again, not reused
        assert abs(alone.test_rmse - results[i].test_rmse) <= 1e-8
