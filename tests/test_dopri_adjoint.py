"""The dopri5 adjoint's eager twin (:func:`nlmodels.baselines._dopri_adjoint.dopri5_adjoint_eager`)
against torchdiffeq's ``odeint_adjoint(method="dopri5", adjoint_options={"norm": "seminorm"})``:
the solution, the gradients of the weights and of the initial state, and the count of field
evaluations, bit for bit, on drawn sizes, grids, tolerances and dtypes, with steps rejected; and
through the models (the reference protocol's NODE and ANODE with the adaptive solver of the
paper's Table 10), on the CPU and on CUDA."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torchdiffeq import odeint, odeint_adjoint

import nlmodels.baselines._dopri_adjoint as twin_module
from nlmodels import build_model
from nlmodels.baselines import REFERENCE_TOLERANCES
from nlmodels.baselines._dopri_adjoint import dopri5_adjoint_eager

D64 = torch.float64


def _field(net: nn.Module, calls: list[int] | None = None):
    def f(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if calls is not None:
            calls.append(1)
        tt = t.to(x).expand(x.shape[0]).unsqueeze(-1)
        return net(torch.cat([tt, x], dim=-1))

    return f


def _torchdiffeq(field, x0, times, owner, *, rtol, atol):
    """The reference code's solve: ``odeint_adjoint`` with dopri5 and the semi-norm."""
    return odeint_adjoint(
        field, x0, times, rtol=rtol, atol=atol, method="dopri5",
        adjoint_params=tuple(owner.parameters()), adjoint_options={"norm": "seminorm"},
    )  # fmt: skip


@pytest.fixture
def error_ratios(monkeypatch) -> list[float]:
    """Every error ratio the twin's step control computes, in order."""
    ratios: list[float] = []
    measure = twin_module._error_ratio

    def spying(*args):
        ratio = measure(*args)
        ratios.append(float(ratio))
        return ratio

    monkeypatch.setattr(twin_module, "_error_ratio", spying)
    return ratios


def _both(net, x0, times, weights, *, rtol, atol):
    """``(solution, gradients of a loss w.r.t. x0 and the live weights, evaluations)`` through
    the twin and through torchdiffeq."""
    out = {}
    for how, solve in (("twin", dopri5_adjoint_eager), ("torchdiffeq", _torchdiffeq)):
        calls: list[int] = []
        x = x0.clone().requires_grad_(True)
        live = [p for p in net.parameters() if p.requires_grad]
        sol = solve(_field(net, calls), x, times, net, rtol=rtol, atol=atol)
        grads = torch.autograd.grad((weights * sol.tanh()).sum(), (x, *live))
        out[how] = (sol.detach(), grads, len(calls))
    return out["twin"], out["torchdiffeq"]


@pytest.mark.parametrize("case", range(8))
def test_the_twin_is_torchdiffeqs_dopri5_adjoint_on_drawn_problems(error_ratios, case):
    """Sizes nobody chose: a batch of 1 to 5, a state of 1 to 3, two to eight output times of
    drawn spacing from a drawn start, one or two hidden layers, tolerances from loose to the
    reference's, float64 or float32: solution, gradients and evaluations equal torchdiffeq's,
    bit for bit."""
    gen = torch.Generator().manual_seed(200 + case)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    dtype = torch.float32 if case % 4 == 3 else D64
    batch, state, points = draw(1, 5), draw(1, 3), draw(2, 8)
    rtol, atol = ((1e-3, 1e-4), (1e-5, 1e-6), (1e-7, 1e-9), (1e-2, 1e-3))[case % 4]
    times = (
        torch.randn(1, generator=gen, dtype=D64)
        + torch.cumsum(torch.rand(points, generator=gen, dtype=D64) * 2 + 0.01, 0)
    ).to(dtype)
    x0 = (2 * torch.randn(batch, state, generator=gen, dtype=D64)).to(dtype)
    weights = torch.randn(points, batch, state, generator=gen, dtype=D64).to(dtype)
    torch.manual_seed(case)
    net = build_model("node", state, hidden=(16,) * draw(1, 2)).to(dtype).field
    with torch.no_grad():  # a livelier field than the initialisation's, to make steps fail
        for p in net.parameters():
            p.mul_(3)
    (sol_a, grads_a, n_a), (sol_b, grads_b, n_b) = _both(
        net, x0, times, weights, rtol=rtol, atol=atol
    )
    assert torch.equal(sol_a, sol_b) and n_a == n_b
    assert min(float(g.abs().max()) for g in grads_b) > 1e-6  # gradients worth comparing
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))
    assert error_ratios  # the twin's own steps ran


def test_a_problem_that_rejects_a_step_is_torchdiffeqs_bit_for_bit(error_ratios):
    """A steep field with loose tolerances: the first step the initial-step rule proposes
    fails, and the retried one, the solution and every gradient are torchdiffeq's."""
    torch.manual_seed(5)
    net = build_model("node", 2, hidden=(16,)).double().field
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(6)
    times = torch.tensor([0.0, 0.7, 2.5], dtype=D64)
    x0 = torch.randn(3, 2, dtype=D64)
    weights = torch.randn(3, 3, 2, dtype=D64)
    (sol_a, grads_a, n_a), (sol_b, grads_b, n_b) = _both(
        net, x0, times, weights, rtol=1e-3, atol=1e-4
    )
    assert max(error_ratios) > 1  # a step was rejected
    assert torch.equal(sol_a, sol_b) and n_a == n_b
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


def test_without_gradients_the_twin_is_the_plain_solve():
    """No gradient asked for (no grad mode, or nothing that requires one): torchdiffeq's
    ``odeint`` itself, which is also the adjoint's forward."""
    torch.manual_seed(1)
    net = build_model("node", 2, hidden=(8,)).double().field
    times, x0 = torch.linspace(0.0, 1.5, 5, dtype=D64), torch.randn(3, 2, dtype=D64)
    plain = odeint(_field(net), x0, times, rtol=1e-6, atol=1e-8, method="dopri5")
    with torch.no_grad():
        assert torch.equal(
            dopri5_adjoint_eager(_field(net), x0, times, net, rtol=1e-6, atol=1e-8), plain
        )
    for p in net.parameters():
        p.requires_grad_(False)
    out = dopri5_adjoint_eager(_field(net), x0, times, net, rtol=1e-6, atol=1e-8)
    assert torch.equal(out, plain) and not out.requires_grad


def test_a_frozen_layer_is_left_out_as_torchdiffeq_leaves_it():
    """The first layer frozen: the other layers' and the initial state's gradients are
    torchdiffeq's, bit for bit, and the frozen layer gets none."""
    torch.manual_seed(2)
    net = build_model("node", 2, hidden=(16, 16)).double().field
    frozen = next(net.parameters())
    frozen.requires_grad_(False)
    times, x0 = torch.linspace(0.0, 1.0, 4, dtype=D64), torch.randn(4, 2, dtype=D64)
    weights = torch.randn(4, 4, 2, dtype=D64)
    (_, grads_a, _), (_, grads_b, _) = _both(net, x0, times, weights, rtol=1e-6, atol=1e-8)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))
    assert frozen.grad is None


def test_a_field_without_parameters_is_torchdiffeqs_and_the_exact_gradient():
    """``dx/dt = a·x`` with no parameters to differentiate (no owner): the initial state's
    gradient is torchdiffeq's bit for bit, and that of ``Σ x(T)`` is ``e^{a (T − t0)}`` to
    the tolerances."""
    rate = -1.3
    x0 = torch.randn(3, 2, dtype=D64)
    times = torch.linspace(0.5, 2.5, 5, dtype=D64)

    def field(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return rate * y

    def twin(x):
        return dopri5_adjoint_eager(field, x, times, None, rtol=1e-8, atol=1e-10)

    def reference(x):
        return odeint_adjoint(
            field, x, times, rtol=1e-8, atol=1e-10, method="dopri5", adjoint_params=(),
            adjoint_options={"norm": "seminorm"},
        )  # fmt: skip

    grads = []
    for solve in (twin, reference):
        x = x0.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(solve(x)[-1].sum(), x)
        grads.append(g)
    assert torch.equal(grads[0], grads[1])
    exact = torch.full_like(x0, math.exp(rate * 2.0))
    torch.testing.assert_close(grads[0], exact, rtol=1e-6, atol=0)


def test_a_second_backward_through_one_solve_is_torchdiffeqs_too():
    """Two losses of one solve, back-propagated one after the other (``retain_graph`` on the
    first), and a grid of one point: the gradients accumulated are torchdiffeq's."""
    torch.manual_seed(3)
    net = build_model("node", 2, hidden=(8,)).double().field
    x0 = torch.randn(2, 2, dtype=D64)
    for times in (torch.linspace(0.0, 1.2, 4, dtype=D64), torch.zeros(1, dtype=D64)):
        grads = {}
        for how, solve in (("twin", dopri5_adjoint_eager), ("torchdiffeq", _torchdiffeq)):
            net.zero_grad()
            x = x0.clone().requires_grad_(True)
            sol = solve(_field(net), x, times, net, rtol=1e-6, atol=1e-8)
            sol.pow(2).sum().backward(retain_graph=True)
            sol.sin().sum().backward()
            grads[how] = [x.grad, *(p.grad for p in net.parameters())]
        assert all(
            (a is None and b is None) or torch.equal(a, b)
            for a, b in zip(grads["twin"], grads["torchdiffeq"], strict=True)
        )


def test_the_twin_refuses_a_time_grid_that_needs_a_gradient():
    net = build_model("node", 1, hidden=(4,)).double().field
    times = torch.linspace(0.0, 1.0, 3, dtype=D64, requires_grad=True)
    with pytest.raises(ValueError, match="time grid"):
        dopri5_adjoint_eager(
            _field(net), torch.ones(2, 1, dtype=D64), times, net, rtol=1e-6, atol=1e-8
        )


@pytest.mark.parametrize("name", ["node", "anode"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_models_dopri5_adjoint_is_torchdiffeqs_bit_for_bit(monkeypatch, name, device):
    """The reference protocol's NODE/ANODE with dopri5 at the reference's tolerances (the paper's
    Table 10 cells): loss, gradients (weights and observed values) and evaluations counted
    through the twin and through ``odeint_adjoint``, the same bytes."""
    from nlmodels.baselines import _solve

    gen = torch.Generator().manual_seed(4)
    grid = torch.cumsum(torch.rand(12, generator=gen, dtype=D64) + 0.05, 0).to(device)
    obs_t, query_t = grid[:5].expand(6, -1), grid[5:].expand(6, -1)
    obs_x = torch.randn(6, 5, 2, generator=gen, dtype=D64).to(device)
    target = torch.randn(6, 7, 2, generator=gen, dtype=D64).to(device)
    settings = {"start": "first_query", "adjoint": True, "solver": "dopri5", **REFERENCE_TOLERANCES}
    out = {}
    for how in ("twin", "torchdiffeq"):
        if how == "torchdiffeq":
            monkeypatch.setattr(_solve, "dopri5_adjoint_eager", _torchdiffeq)
        torch.manual_seed(0)
        model = build_model(name, 2, hidden=(32, 32), **settings).double().to(device)
        x = obs_x.clone().requires_grad_(True)
        model.reset_nfe()
        loss = ((model(obs_t, x, query_t) - target) ** 2).mean()
        grads = torch.autograd.grad(loss, (x, *model.parameters()))
        out[how] = (loss.detach(), grads, model.nfe)
    (loss_a, grads_a, nfe_a), (loss_b, grads_b, nfe_b) = out["twin"], out["torchdiffeq"]
    assert torch.equal(loss_a, loss_b) and nfe_a == nfe_b > 2 * 6
    assert min(float(g.abs().max()) for g in grads_b) > 1e-8
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))
