"""The lane-batched dopri5 against torchdiffeq, and the Latent ODE packed against its own runs."""

from __future__ import annotations

import pytest
import torch
from test_packing import _assert_same, _cfg, _data, _model, _packed, _poisoned, _unpacked
from torch import nn
from torchdiffeq import odeint
from torchdiffeq._impl.dopri5 import _DORMAND_PRINCE_SHAMPINE_TABLEAU, DPS_C_MID

from nlmodels import build_model
from nlmodels.baselines import LatentODE
from nlmodels.baselines._dopri import dopri5_lanes, tableau
from nlmodels.baselines._mlp import stacked_linear, stacked_mlp
from nltrain import TrainingDiverged, packable, seeded, train

# Small sizes: the tests train in seconds; the architecture is the paper's.
SMALL = {"rec_units": 8, "rec_hidden": (8,), "head_hidden": (8,), "ode_hidden": (8, 8)}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Field(nn.Module):
    """A non-autonomous field ``tanh(y W) cos(ωt) − c y``, counting torchdiffeq's steps."""

    def __init__(self, w: torch.Tensor, omega: float = 1.0, damping: float = 0.1) -> None:
        super().__init__()
        self.w = nn.Parameter(w)
        self.omega, self.damping = omega, damping
        self.accepted = self.rejected = self.calls = 0

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lanes(t, y)

    def lanes(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = t.view(*t.shape, *([1] * (y.dim() - t.dim())))
        return torch.tanh(y @ self.w) * torch.cos(self.omega * t) - self.damping * y

    def callback_accept_step(self, t0, y0, dt) -> None:
        self.accepted += 1

    def callback_reject_step(self, t0, y0, dt) -> None:
        self.rejected += 1


def _torchdiffeq(field: _Field, y0, times, rtol, atol):
    field.accepted = field.rejected = field.calls = 0
    y = odeint(field, y0, times, rtol=rtol, atol=atol, method="dopri5")[1:]
    return y, field.calls, field.accepted, field.rejected


def test_tableau_is_torchdiffeqs():
    tab = tableau(torch.float64, torch.device("cpu"))
    ref = _DORMAND_PRINCE_SHAMPINE_TABLEAU
    assert torch.equal(tab.alpha, ref.alpha) and torch.equal(tab.c_error, ref.c_error)
    assert all(torch.equal(a, b) for a, b in zip(tab.beta, ref.beta, strict=True))
    assert torch.equal(tab.mid, DPS_C_MID)


@pytest.mark.parametrize(
    ("rtol", "atol", "omega", "dtype"),
    [
        (1e-3, 1e-4, 1.0, torch.float64),
        (1e-7, 1e-9, 5.0, torch.float64),
        (1e-4, 1e-6, 2.0, torch.float32),
    ],
)
def test_each_lane_takes_torchdiffeqs_steps(rtol, atol, omega, dtype):
    gen = torch.Generator().manual_seed(0)
    field = _Field(torch.randn(3, 3, generator=gen, dtype=torch.float64), omega).to(dtype)
    y0 = torch.stack(
        [torch.randn(6, 3, generator=gen, dtype=torch.float64) * s for s in (0.1, 1, 4)]
    ).to(dtype)
    # Per-lane grids: different starts, lengths covered and spacings.
    times = torch.stack(
        [
            torch.linspace(0.0, 3.0, 8, dtype=torch.float64),
            torch.linspace(0.5, 6.0, 8, dtype=torch.float64),
            torch.linspace(-1.0, 1.0, 8, dtype=torch.float64) ** 3,
        ]
    ).to(dtype)
    sol = dopri5_lanes(field.lanes, y0, times[:, 0], times[:, 1:], rtol=rtol, atol=atol)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    for lane in range(3):
        y, nfe, accepted, rejected = _torchdiffeq(field, y0[lane], times[lane], rtol, atol)
        torch.testing.assert_close(sol.y[lane], y, rtol=0, atol=tol)
        assert int(sol.nfe[lane]) == nfe
        assert (int(sol.accepted[lane]), int(sol.rejected[lane])) == (accepted, rejected)
    assert len(set(sol.nfe.tolist())) == 3  # the lanes took different numbers of steps
    assert int(sol.rejected.sum()) > 0  # and rejections were exercised
    assert not sol.failed.any()


def test_gradients_are_torchdiffeqs():
    gen = torch.Generator().manual_seed(1)
    field = _Field(torch.randn(3, 3, generator=gen, dtype=torch.float64)).double()
    y0 = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    times = torch.linspace(0.2, 4.0, 9, dtype=torch.float64)
    weights = torch.randn(8, 5, 3, generator=gen, dtype=torch.float64)
    y, *_ = _torchdiffeq(field, y0, times, 1e-5, 1e-7)
    expected = torch.autograd.grad((y * weights).sum(), [field.w, y0])
    sol = dopri5_lanes(field.lanes, y0[None], times[:1], times[None, 1:], rtol=1e-5, atol=1e-7)
    got = torch.autograd.grad((sol.y[0] * weights).sum(), [field.w, y0])
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("start", ["at_zero", "constant_field"])
def test_degenerate_first_steps_have_torchdiffeqs_gradients(start):
    # y0 = 0 (torchdiffeq's first step is a constant 1e-6) or f(y1) = f(y0) (its d2 is 0 and
    # not taken): the branches not taken must not bring NaN into the gradient.
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=gen, dtype=torch.float64, requires_grad=True)
    if start == "at_zero":
        y0 = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)

        def field(t, y):
            return torch.tanh(y @ w) + b
    else:
        y0 = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)

        def field(t, y):
            return b.expand_as(y) * torch.ones_like(y)

    times = torch.linspace(0.0, 2.0, 5, dtype=torch.float64)
    y = odeint(field, y0, times, rtol=1e-6, atol=1e-8, method="dopri5")[1:]
    inputs = [b, y0] + ([w] if start == "at_zero" else [])
    expected = torch.autograd.grad((y**2).sum(), inputs)
    sol = dopri5_lanes(field, y0[None], times[:1], times[None, 1:], rtol=1e-6, atol=1e-8)
    got = torch.autograd.grad((sol.y[0] ** 2).sum(), inputs)
    for g, e in zip(got, expected, strict=True):
        assert torch.isfinite(e).all()
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_a_linear_ode_matches_the_matrix_exponential():
    a = torch.tensor([[-0.1, 2.0], [-2.0, -0.3]], dtype=torch.float64)
    y0 = torch.tensor([[1.0, 0.0], [0.3, -2.0]], dtype=torch.float64)  # two trajectories
    t = torch.tensor([0.0, 0.0, 0.7, 1.5, 4.0, 10.0], dtype=torch.float64)  # first output at t0
    sol = dopri5_lanes(lambda t, y: y @ a.T, y0[None], t[:1], t[None, 1:], rtol=1e-10, atol=1e-12)
    exact = torch.stack([y0 @ torch.linalg.matrix_exp(a * s).T for s in t[1:]])
    assert torch.equal(sol.y[0, 0], y0)
    torch.testing.assert_close(sol.y[0], exact, rtol=0, atol=1e-8)


def test_a_lane_does_not_depend_on_the_others_nor_on_the_end_test():
    gen = torch.Generator().manual_seed(2)
    field = _Field(torch.randn(2, 2, generator=gen, dtype=torch.float64), 3.0).double()
    y0 = torch.randn(4, 7, 2, generator=gen, dtype=torch.float64) * 2
    y0[2] = float("nan")  # a failing lane
    times = torch.linspace(0.0, 5.0, 6, dtype=torch.float64).expand(4, -1)
    together = dopri5_lanes(field.lanes, y0, times[:, 0], times[:, 1:], rtol=1e-4, atol=1e-6)
    sparse = dopri5_lanes(
        field.lanes, y0, times[:, 0], times[:, 1:], rtol=1e-4, atol=1e-6, check_every=4
    )
    assert together.failed.tolist() == [False, False, True, False]
    assert torch.isnan(together.y[2]).all()
    for lane in (0, 1, 3):
        alone = dopri5_lanes(
            field.lanes, y0[lane : lane + 1], times[:1, 0], times[:1, 1:], rtol=1e-4, atol=1e-6
        )
        # One lane read every 4 iterations (the CUDA default): the masked path, not the host one.
        masked = dopri5_lanes(
            field.lanes,
            y0[lane : lane + 1],
            times[:1, 0],
            times[:1, 1:],
            rtol=1e-4,
            atol=1e-6,
            check_every=4,
        )
        for other in (together.y[lane], sparse.y[lane], masked.y[0]):
            assert torch.equal(other, alone.y[0])
        nfes = {int(together.nfe[lane]), int(sparse.nfe[lane]), int(masked.nfe[0])}
        assert nfes == {int(alone.nfe[0])}


@pytest.mark.parametrize("z0_time", ["first_observed", "first_query"])
def test_latent_ode_solves_as_torchdiffeq_did(z0_time, monkeypatch):
    with seeded(0):
        model = LatentODE(2, z0_time=z0_time, **SMALL).double()
    gen = torch.Generator().manual_seed(3)
    ot = torch.linspace(0.0, 1.0, 5, dtype=torch.float64)
    qt = torch.linspace(1.0 if z0_time == "first_query" else 1.2, 3.0, 7, dtype=torch.float64)
    x = torch.randn(6, 5, 2, generator=gen, dtype=torch.float64)
    model.reset_nfe()
    ours = model(ot, x, qt)
    ours_nfe = model.nfe
    # The solve as it was: torchdiffeq's odeint through odeint_grid.
    monkeypatch.setattr(LatentODE, "_solves_in_lanes", lambda self: False)
    model.reset_nfe()
    reference = model(ot, x, qt)
    assert ours_nfe == model.nfe
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-12)


def test_stacked_encoder_and_fields_equal_each_members_modules():
    models = []
    for s in range(3):
        with seeded(s):
            models.append(LatentODE(2, encoder_steps=2, **SMALL).double())
    state = {
        n: torch.stack([dict(m.named_parameters())[n] for m in models])
        for n, _ in models[0].named_parameters()
    }
    gen = torch.Generator().manual_seed(6)
    ot = torch.linspace(0.0, 1.0, 5, dtype=torch.float64)
    x = torch.randn(3, 4, 5, 2, generator=gen, dtype=torch.float64)
    mean, std = models[0]._packed_encode(state, ot, x)
    z = torch.randn(3, 4, 7, 2, generator=gen, dtype=torch.float64)
    decoded = stacked_linear(state, "decoder.")(z)
    field = stacked_mlp(models[0].latent_field, state, "latent_field.")(z[:, :, 0])
    for j, m in enumerate(models):
        m_mean, m_std = m.encode(ot, x[j])
        torch.testing.assert_close(mean[j], m_mean, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(std[j], m_std, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(decoded[j], m.decoder(z[j]), rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(field[j], m.latent_field(z[j, :, 0]), rtol=1e-13, atol=1e-13)


def test_packable():
    cpu = torch.device("cpu")
    assert packable(build_model("latent_ode", 1, **SMALL), cpu)
    assert packable(build_model("latent_ode", 1, solver="euler", **SMALL), cpu)
    assert not packable(build_model("latent_ode", 1, adjoint=True, **SMALL), cpu)
    assert not packable(build_model("latent_ode", 1, solver="bosh3", **SMALL), cpu)


def _next_draws(pairs) -> list[torch.Tensor]:
    like = torch.zeros(3, 2, dtype=torch.float64)
    return [m._standard_normal(like) for m, _ in pairs]


@pytest.mark.parametrize(
    "settings",
    [{}, {"z0_time": "first_query", "kl_average": "latents"}, {"solver": "euler"}],
    ids=["dopri5", "dopri5-first-query", "euler"],
)
def test_latent_ode_packed_equals_unpacked(settings):
    seeds = [0, 1, 2]
    datas = [_data(s) for s in seeds]
    cfg = _cfg(epochs=4, patience=1, lr=0.05)
    kw = {**SMALL, **settings}
    unpacked = _unpacked("latent_ode", seeds, cfg, datas, **kw)
    packed = _packed("latent_ode", seeds, cfg, datas, **kw)
    assert all(r.packed_members == 3 for _, r in packed)
    for a, b, d in zip(unpacked, packed, datas, strict=True):
        _assert_same(a, b, d[2])
    # Each member's stream is where its unpacked run left it (training and validation draws).
    for a, b in zip(_next_draws(unpacked), _next_draws(packed), strict=True):
        assert torch.equal(a, b)
    if "solver" not in settings:  # the members' solves took different numbers of steps
        assert len({r.history[0].nfe for _, r in unpacked}) > 1


@pytest.mark.training
def test_cross_system_latent_ode_cells_pack_once_per_time_grid():
    """Cells of other systems (other time grids) in one call: the Latent ODE's lanes share one
    grid, so it packs each grid's members together, and every member gets its unpacked run."""
    seeds = [0, 1, 2, 3]
    datas = [_data(s, t_end=t_end) for s, t_end in zip(seeds, (3.0, 5.0, 3.0, 5.0))]
    cfg = _cfg(epochs=2, lr=0.05)
    unpacked = _unpacked("latent_ode", seeds, cfg, datas, **SMALL)
    packed = _packed("latent_ode", seeds, cfg, datas, **SMALL)
    assert [r.packed_members for _, r in packed] == [2, 2, 2, 2]
    for a, b, d in zip(unpacked, packed, datas, strict=True):
        _assert_same(a, b, d[2])


def test_a_diverging_latent_ode_member_leaves_the_others_unchanged():
    seeds = [0, 1, 2]
    datas = [_data(s) for s in seeds]
    tr, va, te = datas[1]
    datas[1] = (_poisoned(tr, "obs_x"), va, te)
    cfg = _cfg(epochs=3)
    unpacked = _unpacked("latent_ode", seeds, cfg, datas, **SMALL)
    packed = _packed("latent_ode", seeds, cfg, datas, **SMALL)
    assert isinstance(packed[1][1], TrainingDiverged)
    assert "training loss is nan at epoch 0" in str(packed[1][1])
    for a, b, d in zip(unpacked, packed, datas, strict=True):
        _assert_same(a, b, d[2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lanes_and_the_packed_latent_ode_on_cuda_equal_the_cpu():
    # On CUDA the end test is read every 4 iterations: finished lanes step by zero meanwhile.
    gen = torch.Generator().manual_seed(4)
    field = _Field(torch.randn(3, 3, generator=gen, dtype=torch.float64), 2.0).double()
    y0 = (
        torch.randn(5, 6, 3, generator=gen, dtype=torch.float64)
        * torch.linspace(0.1, 4, 5).view(5, 1, 1).double()
    )
    times = torch.linspace(0.0, 4.0, 7, dtype=torch.float64).expand(5, -1)
    cpu = dopri5_lanes(field.lanes, y0, times[:, 0], times[:, 1:], rtol=1e-6, atol=1e-8)
    field.cuda()
    gpu = dopri5_lanes(
        field.lanes, y0.cuda(), times[:, 0].cuda(), times[:, 1:].cuda(), rtol=1e-6, atol=1e-8
    )
    # Conditioning: a few hundred steps of O(1) fields; libm differences of a few ulp per step.
    torch.testing.assert_close(gpu.y.cpu(), cpu.y, rtol=0, atol=1e-10)
    assert torch.equal(gpu.nfe.cpu(), cpu.nfe)
    seeds, cfg = [0, 1], _cfg(epochs=2)
    datas = [_data(s) for s in seeds]
    alone = []
    for s, (tr, va, _) in zip(seeds, datas, strict=True):
        model = _model("latent_ode", s, **SMALL)
        alone.append((model, train(model, tr, va, cfg, device="cuda", seed=s, label=f"m{s}")))
    packed = _packed("latent_ode", seeds, cfg, datas, device="cuda", **SMALL)
    assert all(r.packed_members == 2 for _, r in packed)
    for a, b, d in zip(alone, packed, datas, strict=True):
        _assert_same(a, b, d[2])
