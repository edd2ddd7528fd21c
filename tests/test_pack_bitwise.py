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
from nlmodels.accel import portable
from nltrain import TrainResult, seeded, train, train_packed
from nltrain._member_products import MemberProducts
from tasks.config import TrainConfig, resolve_config

# The quick profile's shapes (tasks/profiles/quick.yaml; 1-D and 2-D systems alike: 100
# observed and 100 predicted points, batches of 32) and its models' default sizes; fewer
# trajectories and epochs keep the default test quick (the slow variants below run the quick
# profile itself).
_QUICK = {"batch_size": 32, "lr": 0.003, "patience": None}

pytestmark = pytest.mark.training  # every test trains models, packed and one by one
MODELS = ("node", "anode", "nf_coupling", "nf_resnet", "latent_ode", "neural_laplace")
# Never packed on the CPU by the engine (nltrain.prefers_one_by_one): their unpacked run
# there is their eager step, which agrees with the pack's arithmetic to rounding only; they are
# compared with their pack of one (how a single cell of them trains where they pack: CUDA).
ONE_BY_ONE_ON_CPU = ("latent_ode", "neural_laplace")
# The Neural Flows' cross-system packs train longest: theirs run in the heavy tier.
_LONGEST_IN_HEAVY = [
    pytest.param(m, marks=pytest.mark.heavy) if m.startswith("nf_") else m for m in MODELS
]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _member(seed: int, t_end: float, n_train: int, dim: int) -> tuple[SplitData, SplitData]:
    grid = {"t_o": 100, "t_q": 100, "t_end": t_end, "dim": dim}
    return _split(100 + seed, n_train, **grid), _split(200 + seed, 20, **grid)


def _model(name: str, seed: int, dim: int, options: dict | None = None):
    with seeded(seed):
        return build_model(name, dim, **(options or {}))


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


def _runs(
    name: str,
    epochs: int,
    n_train: int,
    grids=(3.0, 5.0, 2.0, 3.0),
    dim: int = 2,
    options: dict | None = None,
):
    cfg = TrainConfig(epochs=epochs, **_QUICK)
    data = [_member(s, t_end, n_train, dim) for s, t_end in enumerate(grids)]

    def alone(i: int, packed_members: int):
        """Member ``i``'s unpacked run, to compare with its result in a pack of
        ``packed_members`` (one: the pack trained it alone, by ``train``)."""
        step = "packed" if name in ONE_BY_ONE_ON_CPU and packed_members > 1 else "auto"
        model = _model(name, i, dim, options)
        return model, train(model, *data[i], cfg, seed=i, step=step)

    def packed(members: list[int]):
        models = [_model(name, i, dim, options) for i in members]
        results = train_packed(
            models,
            [data[i][0] for i in members],
            [data[i][1] for i in members],
            cfg,
            seeds=members,
        )
        return dict(zip(members, zip(models, results, strict=True), strict=True))

    return alone, packed


def _check_cross_system(name: str, dim: int, options: dict | None = None) -> None:
    alone, packed = _runs(name, epochs=2, n_train=64, dim=dim, options=options)
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


@pytest.mark.parametrize("name", _LONGEST_IN_HEAVY)
def test_a_cross_system_member_is_bitwise_its_unpacked_run(name):
    """Members of three systems (three time grids) in one pack: each is its own run alone,
    bit for bit, and a member's bytes are the same in another pack (other mates, order, size;
    here with a mate on its own grid, which the Latent ODE packs itself with).

    Packed Neural Laplace and Latent ODE members are compared with their pack of one (see
    ``ONE_BY_ONE_ON_CPU``); the Latent ODE's cross-system pack trains one pack per grid."""
    _check_cross_system(name, 2)


@pytest.mark.parametrize("dim", [1, pytest.param(2, marks=pytest.mark.heavy)])  # 2-D: heavy
# (the two flows share the linear time functions: the heavy tier checks the ResNet flow's)
@pytest.mark.parametrize(
    "name", ["nf_coupling", pytest.param("nf_resnet", marks=pytest.mark.heavy)]
)
def test_the_paper_profiles_flows_pack_bitwise(name, dim):
    """The paper profile's Neural Flows (the reference's linear time functions) too, on 1-D
    and 2-D systems."""
    _check_cross_system(name, dim, dict(resolve_config("paper").models[name]))


@pytest.mark.parametrize(
    "name", ["node", *(pytest.param(n, marks=pytest.mark.slow) for n in MODELS if n != "node")]
)
def test_a_1d_member_is_bitwise_its_unpacked_run(name):
    """The same for 1-D systems (Mackey–Glass, piecewise forcing, integro-differential): their
    products with one output column (NODE's last layer and its weight gradient) are
    matrix–vector products, which MKL rounds differently in a batch of one (a pack of one)
    and in a batch of several; the pack computes them member by member
    (:mod:`nltrain._member_products`). NODE failed here before (34.79543030250215 alone against
    …214 packed in epoch 0's loss on piecewise forcing, quick profile)."""
    _check_cross_system(name, 1)


@pytest.fixture(params=["portable", "torch"])
def products_by(request):
    """The CPU products this process computes by: the portable kernels, or torch's own (MKL,
    as under the native numerics) for the test's time."""
    if not portable.installed():
        pytest.skip("the portable kernels are not installed in this process")
    if request.param == "torch":
        portable.uninstall()
    try:
        yield request.param
    finally:
        portable.install()


@pytest.mark.parametrize("rows, cols", [(32, 1), (1, 32), (32, 2)])
def test_a_packs_matrix_vector_products_are_its_members_batch_of_one_products(
    rows, cols, products_by
):
    """Under :class:`MemberProducts` a batched product of three members gives each member its
    batch-of-one product (the pack of one's), bit for bit. With torch's kernels the scope
    splits the matrix–vector shapes (and remembers which step shapes needed it); the portable
    kernels define each element whatever the batch, so there it stays off."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, rows, 128, generator=g, dtype=torch.float64)
    b = torch.randn(3, 128, cols, generator=g, dtype=torch.float64)
    products = MemberProducts(torch.device("cpu"))
    for _ in range(2):  # the second time with what the first found out
        with products.scope("probe", 3):
            out = torch.bmm(a, b)
        for j in range(3):
            assert torch.equal(out[j], torch.bmm(a[j : j + 1], b[j : j + 1])[0]), j
    split = {("probe", 3): 1 in (rows, cols)}
    assert products.needed == ({} if products_by == "portable" else split)


_QUICK_PACKS = {
    2: ("stiff_van_der_pol", "spiral_dde", "lotka_volterra_dde"),
    1: ("mackey_glass_dde", "piecewise_forcing_ode", "integro_de"),
}


@pytest.mark.slow
@pytest.mark.parametrize("dim", sorted(_QUICK_PACKS))
@pytest.mark.parametrize("name", MODELS)
def test_the_quick_profile_pack_is_bitwise_its_unpacked_runs(name, dim):
    """The quick profile's own packs (its 2-D systems: stiff Van der Pol, spiral and
    Lotka–Volterra DDEs; its 1-D ones: Mackey–Glass, piecewise forcing, integro-differential;
    200 trajectories, its epochs per model): each member equals its unpacked run bit for bit."""
    from tasks.config import resolve_config
    from tasks.pipeline import build_cell_model, prepare_cell, simulate_data

    cfg = resolve_config("quick", overrides={"methods": [name], "progress": False})
    cells = [c for c in cfg.cells() if c.system in _QUICK_PACKS[dim]]
    assert len(cells) == 3
    splits = [prepare_cell(c, simulate_data(c.system, c.data, c.seed)) for c in cells]
    models = [build_cell_model(c, dim)[0] for c in cells]
    results = train_packed(
        models,
        [p.train for p in splits],
        [p.val for p in splits],
        cells[0].training,
        seeds=[c.seed for c in cells],
    )
    for c, p, m, r in zip(cells, splits, models, results, strict=True):
        # A member packed with others equals its pack of one; a member trained alone (a
        # Latent ODE whose grid no other cell shares) equals train's own choice of step.
        packed = r.packed_members > 1 or name == "neural_laplace"
        model = build_cell_model(c, dim)[0]
        result = train(
            model, p.train, p.val, c.training, seed=c.seed, step="packed" if packed else "auto"
        )
        _same_bytes((model, result), (m, r))
        assert np.isfinite(result.best_val_rmse)
