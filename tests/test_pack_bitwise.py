"""One cell, one answer, packed or not: a member of a cross-system pack in the quick profile's
shapes gives, bit for bit, the weights and history of its unpacked run, and a member's bytes do
not depend on what it is packed with.

Why bitwise and not 1e-8: training amplifies rounding. NODE on stiff Van der Pol (quick profile):
the pack's batched kernels and the eager step differed by 1e-15 after one epoch, 6e-10 after 20
and 0.01 after 30; after 115 epochs the test RMSE was 0.402 packed and 0.454 alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_packing import _split

from datasets import SplitData
from nlmodels import build_model
from tasks.config import TrainConfig
from tasks.packing import train_packed
from tasks.training import TrainResult, seeded, train

# The quick profile's shapes (tasks/profiles/quick.yaml; 2-D systems: 100 observed and 100
# predicted points, batches of 32) and its models' default sizes; fewer trajectories and
# epochs keep the default test quick (the slow variant below runs the quick profile itself).
_QUICK = {"batch_size": 32, "lr": 0.003, "patience": None}
MODELS = ("node", "anode", "nf_coupling", "nf_resnet", "latent_ode", "neural_laplace")
# Never packed on the CPU by the engine (tasks.packing.prefers_one_by_one): their unpacked run
# there is their eager step, which agrees with the pack's arithmetic to rounding only; they are
# compared with their pack of one (how a single cell of them trains where they pack: CUDA).
ONE_BY_ONE_ON_CPU = ("latent_ode", "neural_laplace")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _member(seed: int, t_end: float, n_train: int) -> tuple[SplitData, SplitData]:
    grid = {"t_o": 100, "t_q": 100, "t_end": t_end}
    return _split(100 + seed, n_train, **grid), _split(200 + seed, 20, **grid)


def _model(name: str, seed: int):
    with seeded(seed):
        return build_model(name, 2)


def _same_bytes(a: tuple, b: tuple) -> None:
    (ma, ra), (mb, rb) = a, b
    assert isinstance(ra, TrainResult) and isinstance(rb, TrainResult)
    strip = [dataclasses.replace(e, seconds=0.0) for e in ra.history]
    assert [dataclasses.replace(e, seconds=0.0) for e in rb.history] == strip
    assert (ra.best_epoch, ra.best_val_rmse) == (rb.best_epoch, rb.best_val_rmse)
    sa, sb = ma.state_dict(), mb.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def _runs(name: str, epochs: int, n_train: int, grids=(3.0, 5.0, 2.0, 3.0)):
    cfg = TrainConfig(epochs=epochs, **_QUICK)
    data = [_member(s, t_end, n_train) for s, t_end in enumerate(grids)]

    def alone(i: int, packed_members: int):
        """Member ``i``'s unpacked run, to compare with its result in a pack of
        ``packed_members`` (one: the pack trained it alone, by ``train``)."""
        step = "packed" if name in ONE_BY_ONE_ON_CPU and packed_members > 1 else "auto"
        model = _model(name, i)
        return model, train(model, *data[i], cfg, seed=i, step=step)

    def packed(members: list[int]):
        models = [_model(name, i) for i in members]
        results = train_packed(
            models,
            [data[i][0] for i in members],
            [data[i][1] for i in members],
            cfg,
            seeds=members,
        )
        return dict(zip(members, zip(models, results, strict=True), strict=True))

    return alone, packed


@pytest.mark.parametrize("name", MODELS)
def test_a_cross_system_member_is_bitwise_its_unpacked_run(name):
    """Members of three systems (three time grids) in one pack: each is its own run alone,
    bit for bit, and a member's bytes are the same in another pack (other mates, order, size;
    here with a mate on its own grid, which the Latent ODE packs itself with).

    Packed Neural Laplace and Latent ODE members are compared with their pack of one (see
    ``ONE_BY_ONE_ON_CPU``); the Latent ODE's cross-system pack trains one pack per grid."""
    alone, packed = _runs(name, epochs=2, n_train=64)
    full = packed([0, 1, 2])
    size = 1 if name == "latent_ode" else 3
    assert all(r.packed_members == size for _, r in full.values())
    for i in (0, 1, 2):
        _same_bytes(alone(i, size), full[i])
    pair = packed([3, 0])
    assert pair[0][1].packed_members == 2
    _same_bytes(alone(0, 2), pair[0])
    if name not in ONE_BY_ONE_ON_CPU:
        _same_bytes(full[0], pair[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_the_quick_profile_pack_is_bitwise_its_unpacked_runs(name):
    """The quick profile's own pack (stiff Van der Pol, spiral and Lotka–Volterra DDEs, 200
    trajectories, its epochs per model): each member equals its unpacked run bit for bit."""
    from tasks.config import resolve_config
    from tasks.pipeline import build_cell_model, prepare_cell, simulate_data

    cfg = resolve_config("quick", overrides={"methods": [name], "progress": False})
    cells = [
        c
        for c in cfg.cells()
        if c.system in ("stiff_van_der_pol", "spiral_dde", "lotka_volterra_dde")
    ]
    assert len(cells) == 3
    splits = [prepare_cell(c, simulate_data(c.system, c.data, c.seed)) for c in cells]
    # the Latent ODE's three grids: three packs of one (trained alone, by train)
    step = "packed" if name == "neural_laplace" else "auto"
    models = [build_cell_model(c, 2)[0] for c in cells]
    results = train_packed(
        models,
        [p.train for p in splits],
        [p.val for p in splits],
        cells[0].training,
        seeds=[c.seed for c in cells],
    )
    for c, p, m, r in zip(cells, splits, models, results, strict=True):
        model = build_cell_model(c, 2)[0]
        result = train(model, p.train, p.val, c.training, seed=c.seed, step=step)
        _same_bytes((model, result), (m, r))
        assert np.isfinite(result.best_val_rmse)
