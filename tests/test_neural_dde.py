"""The neural DDE (nlmodels.neural_dde): its solver on delay equations with known solutions and
against the data's own DDE integrator, the model on a known delay, gradients in the delays,
packing and CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from datasets import simulate
from nlmodels import build_model
from nlmodels.neural_dde import NeuralDDE, dde_solve

F64 = torch.float64


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def decay(a: float, tau: float, t: torch.Tensor) -> torch.Tensor:
    """x' = −a x(t − τ), x = 1 for t <= 0: the method of steps' closed form on [0, 3τ]."""
    u = t / tau
    x = 1 - a * t
    x = x + torch.where(u > 1, a**2 * (t - tau) ** 2 / 2, 0 * t)
    return x - torch.where(u > 2, a**3 * (t - 2 * tau) ** 3 / 6, 0 * t)


def _minus_delayed(t, x, delayed):
    return -delayed[:, 0]


def _solve(tau, query, *, hist_t=(-3.0, 0.0), hist_x=None, **kw) -> torch.Tensor:
    ht = torch.tensor([hist_t], dtype=F64)
    hx = torch.ones(1, len(hist_t), 1, dtype=F64) if hist_x is None else hist_x
    q = query.reshape(1, -1)
    return dde_solve(_minus_delayed, ht, hx, q, torch.tensor([[tau]], dtype=F64), **kw)[0, :, 0]


# ---------------------------------------------------------------- the solver


def test_rk4_solves_a_delayed_decay_to_rounding():
    """x' = −x(t − 1) after a constant history: a piecewise polynomial of degree ≤ 3 on [0, 3],
    which the Hermite-interpolated RK4 reproduces exactly when the delay is a multiple of the
    step (every kink on a node), on the prediction grid and with substeps."""
    q = torch.linspace(0.1, 3.0, 30, dtype=F64)
    for substeps in (1, 7):
        assert torch.allclose(_solve(1.0, q, substeps=substeps), decay(1.0, 1.0, q), atol=1e-13)


def test_rk4_converges_when_the_kinks_fall_between_nodes():
    """With the kinks (t = τ, 2τ) inside steps, the one step over t = τ, where the field's slope
    jumps, costs O(h²) (a quadrature exact for cubics across a kink): second order overall;
    Euler is first order."""
    q = torch.linspace(0.07, 2.94, 42, dtype=F64)  # step 0.07: τ = 1 and 2 are no nodes
    exact = decay(1.0, 1.0, q)
    for substeps in (1, 2, 4, 8, 16):
        error = float((_solve(1.0, q, substeps=substeps) - exact).abs().max())
        assert error < 0.03 * (0.07 / substeps) ** 2, (substeps, error)
    euler = [(_solve(1.0, q, substeps=s, scheme="euler") - exact).abs().max() for s in (4, 8)]
    assert 1.8 < float(euler[0] / euler[1]) < 2.2  # first order


def test_the_history_is_the_interpolated_prefix():
    """History x(t) = t on [−2, 0] (a line, which linear interpolation holds exactly): then
    x' = −(t − 1) on [0, 1], x = t − t²/2; a delay shorter than the step reads the step's own
    extrapolated piece (second order: against the same equation solved with τ as the step)."""
    ht = torch.linspace(-2.0, 0.0, 9, dtype=F64)
    q = torch.linspace(0.1, 1.0, 10, dtype=F64)
    x = _solve(1.0, q, hist_t=tuple(ht.tolist()), hist_x=ht.reshape(1, -1, 1))
    assert torch.allclose(x, q - q**2 / 2, atol=1e-13)
    ref = _solve(0.0025, q, substeps=40)  # h = τ: every delayed time on a node or midpoint
    errors = [float((_solve(0.0025, q, substeps=s) - ref).abs().max()) for s in (1, 4)]
    assert errors[0] < 1e-3 and errors[0] / errors[1] > 12, errors


def test_agrees_with_the_data_simulator_on_the_spiral_dde():
    """The suite's spiral DDE, x' = A tanh(x(t) + x(t − 2.5)) after a constant history, as
    ``datasets.simulate`` makes it (RK4 with Hermite-interpolated delayed states, step 0.01), on
    its first 100 points (three kinks): the same to rounding at the same step, and within 1e-5
    on the prediction grid itself (the model's default, step 0.1)."""
    data = simulate("spiral_dde", n_trajectories=3, n_points=200)
    a = torch.tensor([[-1.0, 1.0], [-1.0, -1.0]], dtype=F64)

    def field(t, x, delayed):
        return torch.tanh(x + delayed[:, 0]) @ a.T

    t = torch.tensor(data.t[:100]).expand(3, -1)  # steps of 0.1
    history = torch.tensor(data.ic)[:, None].expand(-1, 2, -1)
    for substeps, tolerance in ((10, 1e-12), (1, 1e-5)):
        out = dde_solve(
            field,
            torch.stack([t[:, 0] - 3, t[:, 0]], dim=1),
            history,
            t[:, 1:],
            torch.full((3, 1), 2.5, dtype=F64),
            substeps=substeps,
        )
        assert np.abs(out.numpy() - data.x_clean[:, 1:100]).max() < tolerance, substeps


def test_each_trajectory_has_its_own_grid_and_delays():
    ht = torch.tensor([[-3.0, 0.0], [-2.0, 0.5]], dtype=F64)
    q = torch.linspace(0.1, 2.0, 20, dtype=F64) + torch.tensor([[0.0], [0.5]], dtype=F64)
    taus = torch.tensor([[1.0], [0.7]], dtype=F64)
    both = dde_solve(_minus_delayed, ht, torch.ones(2, 2, 1, dtype=F64), q, taus)
    ones = torch.ones(1, 2, 1, dtype=F64)
    for b in range(2):
        one = slice(b, b + 1)
        alone = dde_solve(_minus_delayed, ht[one], ones, q[one], taus[one])
        assert torch.allclose(both[b], alone[0], atol=1e-15)
    assert torch.allclose(both[1, :, 0], decay(1.0, 0.7, q[1] - 0.5), atol=1e-13)


def test_the_solution_is_differentiable_in_the_delays():
    """d x(t)/dτ of the decay on (τ, 2τ) is −(t − τ) (from x = 1 − t + (t − τ)²/2): the
    scheme's derivative converges to it at first order in the step (moving τ moves the kink at
    t = τ off its node); and gradcheck on a nonlinear field with two delays and a history of
    several points."""
    q = torch.linspace(0.1, 1.5, 15, dtype=F64)
    for substeps in (1, 10):
        tau = torch.tensor([[1.0]], dtype=F64, requires_grad=True)
        x = dde_solve(_minus_delayed, torch.tensor([[-3.0, 0.0]], dtype=F64),
                      torch.ones(1, 2, 1, dtype=F64), q[None], tau, substeps=substeps)  # fmt: skip
        (grad,) = torch.autograd.grad(x[0, -1, 0], tau)
        assert abs(float(grad) + 0.5) < 0.2 * 0.1 / substeps, (substeps, float(grad))

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 1)).double()

    def field(t, x, delayed):
        return net(torch.cat([t[:, None], x, delayed.flatten(1)], dim=-1))

    ht = torch.linspace(-1.5, 0.0, 7, dtype=F64).expand(2, -1)
    hx = torch.sin(3 * ht).unsqueeze(-1)
    qt = torch.linspace(0.2, 1.0, 5, dtype=F64).expand(2, -1)
    taus = torch.tensor([[0.37, 0.81], [0.53, 1.13]], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda d: dde_solve(field, ht, hx, qt, d, substeps=2), taus)


# ---------------------------------------------------------------- the model


class _Decay(nn.Module):
    """f = −a x(t − τ_1), from the row [t, x, x(t − τ_1)]."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = a

    def forward(self, row: torch.Tensor) -> torch.Tensor:
        return -self.a * row[..., 2:3]


def test_the_model_with_a_known_field_reproduces_a_known_delay():
    """Field −0.8 x(t − τ) and θ = 0: τ is half the observed window (1.2 of 2.4)."""
    model = NeuralDDE(1, delays=1, vector_field=_Decay(0.8)).double()
    with torch.no_grad():
        model.delay_logits.zero_()
    obs_t = torch.linspace(-2.4, 0.0, 25, dtype=F64)
    query_t = torch.linspace(0.1, 3.6, 36, dtype=F64)
    y = model(obs_t, torch.ones(3, 25, 1, dtype=F64), query_t)
    assert y.shape == (3, 36, 1)
    assert torch.allclose(model.delays(obs_t[None]), torch.tensor([[1.2]], dtype=F64))
    assert torch.allclose(y[..., 0], decay(0.8, 1.2, query_t).expand(3, -1), atol=1e-13)
    assert model.nfe == 1 + 4 * 36


def test_the_delays_learn_and_stay_inside_the_window():
    torch.manual_seed(0)
    model = build_model("neural_dde", 2).double()
    obs_t = torch.linspace(0.0, 4.0, 20, dtype=F64)
    loss = model(obs_t, torch.randn(4, 20, 2, dtype=F64), obs_t[-1] + obs_t[1:6]).square().mean()
    loss.backward()
    assert model.delay_logits.grad is not None and bool((model.delay_logits.grad != 0).all())
    with torch.no_grad():
        model.delay_logits.copy_(torch.tensor([-40.0, 40.0]))
    taus = model.delays(obs_t[None])
    assert 0 <= float(taus.detach().min()) and float(taus.detach().max()) <= 4.0


def test_size_near_the_baselines_budget():
    """Table 7 of the Neural Laplace paper: NODE 17,025, ANODE 17,282 parameters (D = 1)."""
    sizes = [sum(p.numel() for p in build_model("neural_dde", d).parameters()) for d in (1, 2)]
    assert sizes == [17_283, 17_796]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"delays": 0}, "delays must be between 1 and 32, got 0"),
        ({"substeps": 65}, "substeps must be between 1 and 64, got 65"),
        ({"scheme": "rk5"}, "scheme must be one of"),
    ],
)
def test_bad_options_are_refused_in_one_line(kw, message):
    with pytest.raises(ValueError, match=message):
        build_model("neural_dde", 1, **kw)


def test_a_query_before_the_last_observation_is_refused():
    model = build_model("neural_dde", 1).double()
    t = torch.linspace(0.0, 1.0, 6, dtype=F64)
    with pytest.raises(ValueError, match="query_t must not precede the last observed time"):
        model(t[:4], torch.zeros(2, 4, 1, dtype=F64), t[2:])


@pytest.mark.heavy  # trains packs and members alone (test_pack_bitwise covers packing)
@pytest.mark.training
def test_packed_members_train_bitwise_as_alone():
    """Members of three systems' grids in one pack (``torch.func.vmap``) give each member's
    own run, bit for bit (the project's packing check, ``tests/test_pack_bitwise.py``)."""
    from test_pack_bitwise import _check_cross_system

    _check_cross_system("neural_dde", 1, {"hidden": (16, 16)})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_the_cpu():
    torch.manual_seed(0)
    model = build_model("neural_dde", 2).double()
    obs_t = torch.linspace(0.0, 4.0, 50, dtype=F64)
    obs_x, query_t = torch.randn(8, 50, 2, dtype=F64), torch.linspace(4.1, 8.0, 40, dtype=F64)
    cpu = model(obs_t, obs_x, query_t)
    gpu = model.cuda()(obs_t.cuda(), obs_x.cuda(), query_t.cuda())
    assert torch.allclose(gpu.cpu(), cpu, atol=1e-10)
