"""The reference protocol's NODE and ANODE in packs: torchdiffeq's Euler adjoint in batchable ops
(:func:`nlmodels.baselines._euler.euler_adjoint`), packed on CUDA only; and one cell's eager
twin (:func:`nlmodels.baselines._euler.euler_adjoint_eager`), torchdiffeq's bytes with less work.

On the CPU twin (the same packed code, the CPU added to ``ADJOINT_PACKS_ON`` for the test):
the twin's gradients are torchdiffeq's ``odeint_adjoint`` (``method="euler"``, the semi-norm)
and the closed form of the Euler adjoint on a linear ODE; a packed member is bit for bit its
pack of one, and within rounding its eager run through torchdiffeq. Without the test's
switch the CPU keeps the eager step (nothing recorded there changes)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from test_pack_bitwise import _check_cross_system
from test_packing import _assert_same, _cfg, _data, _model, _unpacked
from torch import nn
from torch.func import functional_call, vmap
from torchdiffeq import odeint_adjoint

import nltrain._packed_cells as packed_cells
from nlmodels import build_model
from nlmodels.baselines._euler import euler_adjoint, euler_adjoint_eager, euler_steps
from nltrain import packable, prefers_one_by_one, train, train_packed
from tasks.config import resolve_config

D64 = torch.float64
REFERENCE = {"start": "first_query", "adjoint": True}  # the paper profile's NODE and ANODE


@pytest.fixture
def cpu_twin(monkeypatch):
    """The CPU added to the devices where the adjoint packs: the packed path on the CPU."""
    monkeypatch.setattr(packed_cells, "ADJOINT_PACKS_ON", ("cpu", "cuda"))


class _Rate(nn.Module):
    """``dx/dt = a·x`` (time first in the input, ignored) with the rate ``a`` a parameter."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a, dtype=D64))

    def forward(self, tx: torch.Tensor) -> torch.Tensor:
        return self.a * tx[..., 1:]


def _field(module: nn.Module):
    def f(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        tt = t.to(x).expand(x.shape[0]).unsqueeze(-1)
        return module(torch.cat([tt, x], dim=-1))

    return f


def test_the_twin_is_torchdiffeqs_euler_adjoint():
    """Solution and gradients (parameters and initial state) of an MLP field against
    ``odeint_adjoint(method="euler", adjoint_options={"norm": "seminorm"})``."""
    torch.manual_seed(0)
    net = build_model("node", 2, hidden=(16, 16)).double().field
    times = torch.linspace(0.3, 2.1, 9, dtype=D64)
    x0 = torch.randn(5, 2, dtype=D64)
    target = torch.randn(9, 5, 2, dtype=D64)
    params = tuple(net.parameters())
    out = []
    for solve in ("twin", "torchdiffeq"):
        x = x0.clone().requires_grad_(True)
        if solve == "twin":
            sol = euler_adjoint(_field(net), x, times, net)
        else:
            sol = odeint_adjoint(
                _field(net), x, times, method="euler", adjoint_params=params,
                adjoint_options={"norm": "seminorm"},
            )  # fmt: skip
        loss = ((sol - target) ** 2).mean()
        out.append((sol.detach(), torch.autograd.grad(loss, (x, *params))))
    (sol_a, grads_a), (sol_b, grads_b) = out
    assert torch.equal(sol_a, sol_b)  # the same Euler steps
    assert torch.equal(sol_a, euler_steps(_field(net), x0, times).detach())
    assert min(float(g.abs().max()) for g in grads_b) > 1e-4  # gradients worth comparing
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


def _torchdiffeq(field, x0: torch.Tensor, times: torch.Tensor, owner: nn.Module) -> torch.Tensor:
    """The reference code's solve: ``odeint_adjoint`` with Euler and the semi-norm."""
    return odeint_adjoint(
        field, x0, times, method="euler", adjoint_params=tuple(owner.parameters()),
        adjoint_options={"norm": "seminorm"},
    )  # fmt: skip


def _each_adjoint(monkeypatch) -> Iterator[str]:
    """``eager``, then ``torchdiffeq``: the eager twin swapped for ``odeint_adjoint`` where the
    models' solve calls it."""
    from nlmodels.baselines import _solve

    yield "eager"
    monkeypatch.setattr(_solve, "euler_adjoint_eager", lambda f, x, t, o, count: (
        _torchdiffeq(f, x, t, o)
    ))  # fmt: skip
    yield "torchdiffeq"


@pytest.mark.parametrize("name", ["node", "anode"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared grid", "per-sample grids"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_eager_twin_is_torchdiffeqs_euler_adjoint_bit_for_bit(
    monkeypatch, name, shared, device
):
    """A reference-protocol model's loss and gradients (weights and the observed values), and
    its count of field evaluations, through the eager twin and through ``odeint_adjoint``: the
    same bytes, on uneven grids shared by the batch or each sample's own (the change of
    variables of :func:`~nlmodels.baselines._solve.odeint_grid`), on the CPU and on CUDA (a
    cell that does not pack there)."""
    gen = torch.Generator().manual_seed(3)
    steps = torch.rand(6, 13, generator=gen, dtype=D64) + 0.05
    grid = torch.cumsum(steps if not shared else steps[:1].expand(6, -1), dim=1).to(device)
    obs_t, query_t = grid[:, :5], grid[:, 5:]
    obs_x = torch.randn(6, 5, 2, generator=gen, dtype=D64).to(device)
    target = torch.randn(6, 8, 2, generator=gen, dtype=D64).to(device)
    out = {}
    for how in _each_adjoint(monkeypatch):
        model = _model(name, 0, **REFERENCE).double().to(device)
        x = obs_x.clone().requires_grad_(True)
        model.reset_nfe()
        loss = ((model(obs_t, x, query_t) - target) ** 2).mean()
        grads = torch.autograd.grad(loss, (x, *model.parameters()))
        out[how] = (loss.detach(), grads, model.nfe)
    (loss_a, grads_a, nfe_a), (loss_b, grads_b, nfe_b) = out["eager"], out["torchdiffeq"]
    # one evaluation per interval forwards and one backwards; the shared grid starts at the
    # first query time itself, the index grid of per-sample ones has an empty first interval
    assert torch.equal(loss_a, loss_b) and nfe_a == nfe_b == 2 * (7 if shared else 8)
    assert min(float(g.abs().max()) for g in grads_b) > 1e-6  # gradients worth comparing
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


@pytest.mark.parametrize("case", range(6))
def test_the_eager_twin_is_torchdiffeqs_on_drawn_sizes_and_grids(case):
    """Sizes nobody chose: a batch of 1 to 4, a state of 1 to 3, one to six intervals of drawn
    lengths from a drawn start, one or two hidden layers, a drawn loss: solution, gradients
    and evaluations counted equal torchdiffeq's, bit for bit."""
    gen = torch.Generator().manual_seed(100 + case)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    batch, state, points = draw(1, 4), draw(1, 3), draw(2, 7)
    hidden = (8,) * draw(1, 2)
    times = torch.randn(1, generator=gen, dtype=D64) + torch.cumsum(
        torch.rand(points, generator=gen, dtype=D64) + 0.01, 0
    )
    x0 = torch.randn(batch, state, generator=gen, dtype=D64)
    weights = torch.randn(points, batch, state, generator=gen, dtype=D64)
    torch.manual_seed(case)
    net = build_model("node", state, hidden=hidden).double().field
    out, calls = {}, []

    def field(t, x):
        calls.append(1)
        return _field(net)(t, x)

    for how in ("eager", "torchdiffeq"):
        calls.clear()
        solve = euler_adjoint_eager if how == "eager" else _torchdiffeq
        count = {"count": lambda: calls.append(1)} if how == "eager" else {}
        x = x0.clone().requires_grad_(True)
        sol = solve(field, x, times, net, **count)
        grads = torch.autograd.grad((weights * sol.tanh()).sum(), (x, *net.parameters()))
        out[how] = (sol.detach(), grads, len(calls))
    (sol_a, grads_a, n_a), (sol_b, grads_b, n_b) = out["eager"], out["torchdiffeq"]
    assert torch.equal(sol_a, sol_b) and n_a == n_b == 2 * (points - 1)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


def test_a_frozen_layer_is_left_out_of_the_eager_twins_adjoint_as_torchdiffeq_leaves_it():
    """The field's first layer frozen (``requires_grad`` off): the other layers' gradients
    and the initial state's are torchdiffeq's, bit for bit, and the frozen layer gets none."""
    torch.manual_seed(2)
    net = build_model("node", 2, hidden=(16, 16)).double().field
    frozen = next(net.parameters())
    frozen.requires_grad_(False)
    times, x0 = torch.linspace(0.0, 1.0, 6, dtype=D64), torch.randn(4, 2, dtype=D64)
    grads = {}
    for how in ("eager", "torchdiffeq"):
        solve = euler_adjoint_eager if how == "eager" else _torchdiffeq
        x = x0.clone().requires_grad_(True)
        live = [p for p in net.parameters() if p.requires_grad]
        grads[how] = torch.autograd.grad(solve(_field(net), x, times, net).sum(), (x, *live))
    assert all(torch.equal(a, b) for a, b in zip(grads["eager"], grads["torchdiffeq"], strict=True))
    assert frozen.grad is None


def test_a_second_backward_through_the_eager_twin_is_torchdiffeqs_too():
    """Two losses of one solve, back-propagated one after the other (``retain_graph`` on the
    first): the second backward, whose forward graphs the first has used, evaluates the field
    afresh, as torchdiffeq always does; the gradients accumulated are its, bit for bit."""
    torch.manual_seed(1)
    net = build_model("node", 2, hidden=(16, 16)).double().field
    times, x0 = torch.linspace(0.2, 1.4, 7, dtype=D64), torch.randn(4, 2, dtype=D64)
    grads = {}
    for how in ("eager", "torchdiffeq"):
        net.zero_grad()
        solve = euler_adjoint_eager if how == "eager" else _torchdiffeq
        sol = solve(_field(net), x0, times, net)
        (sol**2).mean().backward(retain_graph=True)
        sol[-1].sum().backward()
        grads[how] = [p.grad.clone() for p in net.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(grads["eager"], grads["torchdiffeq"], strict=True))


def test_the_eager_twin_without_gradients_is_the_plain_euler_solve():
    """Under ``no_grad`` (validation, forecasts) or with nothing to differentiate, the eager
    twin is Euler's solve and keeps no graph; a time grid that wants a gradient is refused."""
    torch.manual_seed(0)
    net = build_model("node", 2, hidden=(8,)).double().field
    times, x0 = torch.linspace(0.0, 1.0, 6, dtype=D64), torch.randn(3, 2, dtype=D64)
    plain = euler_steps(_field(net), x0, times).detach()
    with torch.no_grad():
        sol = euler_adjoint_eager(_field(net), x0, times, net)
    assert torch.equal(sol, plain) and not sol.requires_grad
    net.requires_grad_(False)
    sol = euler_adjoint_eager(_field(net), x0, times, net)
    assert torch.equal(sol, plain) and sol.grad_fn is None
    with pytest.raises(ValueError, match="time grid"):
        euler_adjoint_eager(_field(net), x0, times.clone().requires_grad_(True), net)


@pytest.mark.parametrize("name", ["node", "anode"])
@pytest.mark.training
def test_a_reference_cell_trains_to_the_same_bytes_through_either_adjoint(monkeypatch, name):
    """Three epochs of a reference-protocol cell (clipping, Adam, validation, best weights)
    through the eager twin and through ``odeint_adjoint``: the same history, evaluations
    counted and weights, bit for bit, so the cells recorded through torchdiffeq count as
    they are."""
    data, cfg = _data(0), _cfg(epochs=3)
    runs = {}
    for how in _each_adjoint(monkeypatch):
        model = _model(name, 0, **REFERENCE)
        result = train(model, data[0], data[1], cfg, seed=0)
        history = [(r.epoch, r.train_loss, r.val_loss, r.val_rmse, r.nfe) for r in result.history]
        runs[how] = (model.state_dict(), history)
    (weights_a, history_a), (weights_b, history_b) = runs["eager"], runs["torchdiffeq"]
    assert history_a == history_b
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


@pytest.mark.parametrize("steps", [4, 40])
def test_the_twin_on_a_linear_ode_is_the_euler_adjoints_closed_form(steps):
    """``dx/dt = a·x``, loss ``x(T)``: the Euler adjoint's gradient is ``T·x0·(1 + a·h)^N``
    (``N`` steps of ``h``), torchdiffeq's too, while back-propagation through the Euler solve
    gives ``T·x0·(1 + a·h)^(N−1)``; both tend to ``T·x0·e^(aT)``. Three members with their
    own rates under ``vmap`` (a pack) each get their own closed form."""
    rates, x0, t_end = (-0.7, 0.3, 1.1), 1.5, 2.0
    times = torch.linspace(0.0, t_end, steps + 1, dtype=D64)
    h = t_end / steps
    for a in rates:
        expected = t_end * x0 * (1 + a * h) ** steps
        grads = {}
        for how in ("twin", "eager twin", "torchdiffeq", "backprop"):
            rate = _Rate(a)
            x = torch.full((1, 1), x0, dtype=D64)
            if how == "twin":
                sol = euler_adjoint(_field(rate), x, times, rate)
            elif how == "eager twin":
                sol = euler_adjoint_eager(_field(rate), x, times, rate)
            elif how == "torchdiffeq":
                sol = odeint_adjoint(
                    _field(rate), x, times, method="euler", adjoint_params=(rate.a,),
                    adjoint_options={"norm": "seminorm"},
                )  # fmt: skip
            else:
                sol = euler_steps(_field(rate), x, times)
            (grads[how],) = torch.autograd.grad(sol[-1].sum(), rate.a)
        assert float(grads["twin"]) == pytest.approx(expected, rel=1e-13)
        assert float(grads["eager twin"]) == pytest.approx(expected, rel=1e-13)
        assert float(grads["torchdiffeq"]) == pytest.approx(expected, rel=1e-13)
        discrete = t_end * x0 * (1 + a * h) ** (steps - 1)
        assert float(grads["backprop"]) == pytest.approx(discrete, rel=1e-13)
        assert abs(float(grads["twin"]) - discrete) > 1e-4  # the two are told apart
        exact = t_end * x0 * math.exp(a * t_end)
        assert abs(float(grads["twin"]) - exact) < 3 * abs(a) * h * abs(exact) + 1e-12

    class Solve(nn.Module):  # a member: its rate a parameter, swapped in by functional_call
        def __init__(self) -> None:
            super().__init__()
            self.rate = _Rate(0.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return euler_adjoint(_field(self.rate), x, times, self.rate)[-1].sum()

    solve, stacked = Solve(), {"rate.a": torch.tensor(rates, dtype=D64, requires_grad=True)}
    xs = torch.full((3, 1, 1), x0, dtype=D64)
    losses = vmap(lambda s, x: functional_call(solve, s, (x,)))(stacked, xs)
    (g,) = torch.autograd.grad(losses.sum(), stacked["rate.a"])
    for a, got in zip(rates, g.tolist(), strict=True):
        assert got == pytest.approx(t_end * x0 * (1 + a * h) ** steps, rel=1e-13)


def test_the_adjoint_packs_on_cuda_only():
    """NODE/ANODE through the adjoint of an Euler solve pack on CUDA; on the CPU they keep
    their eager step (one by one, torchdiffeq's ``odeint_adjoint``); other adjoint solves
    never pack."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for name in ("node", "anode"):
        model = build_model(name, 1, **REFERENCE)
        assert packable(model, cuda) and not packable(model, cpu)
        assert not prefers_one_by_one(model, cuda)
        assert not packable(build_model(name, 1, solver="dopri5", adjoint=True), cuda)
    assert ("cpu" in packed_cells.ADJOINT_PACKS_ON) is False


def test_the_engine_packs_the_paper_profiles_ode_cells_on_cuda_only():
    """The paper profile's NODE cells: packs on CUDA, one cell each on the CPU (as recorded)."""
    from tasks.engine import make_packs

    cells = [c for c in resolve_config("paper").cells() if c.method == "node"]
    assert [len(p) for p in make_packs(cells, True)] == [1] * 30
    assert sorted(len(p) for p in make_packs(cells, True, device="cuda")) == [5] * 6


def test_without_the_switch_a_cpu_pack_trains_one_by_one():
    """``train_packed`` (the numerics canary's pack of two) trains the reference NODE one by
    one on the CPU: each result is its eager run's, bit for bit."""
    datas = [_data(s) for s in (0, 1)]
    cfg = _cfg(epochs=2)
    packed = [_model("node", s, **REFERENCE) for s in (0, 1)]
    results = train_packed(packed, [d[0] for d in datas], [d[1] for d in datas], cfg, seeds=[0, 1])
    assert all(r.packed_members == 1 for r in results)
    for s, (model, result) in enumerate(zip(packed, results, strict=True)):
        alone = _model("node", s, **REFERENCE)
        mine = train(alone, datas[s][0], datas[s][1], cfg, seed=s)
        assert [e.train_loss for e in mine.history] == [e.train_loss for e in result.history]
        for a, b in zip(alone.state_dict().values(), model.state_dict().values(), strict=True):
            assert torch.equal(a, b)


@pytest.mark.training
@pytest.mark.parametrize("dim", [1, pytest.param(2, marks=pytest.mark.heavy)])  # 2-D: heavy
# (ANODE is NODE's pack with its state augmented: the heavy tier checks it)
@pytest.mark.parametrize("name", ["node", pytest.param("anode", marks=pytest.mark.heavy)])
def test_a_packed_reference_member_is_bitwise_its_pack_of_one(cpu_twin, name, dim):
    """Members of three systems in one pack (their own grids), and in another pack: each is
    its pack of one bit for bit (how a lone cell trains on CUDA)."""
    _check_cross_system(name, dim, dict(resolve_config("paper").models[name]))


@pytest.mark.training
@pytest.mark.parametrize("name", ["node", "anode"])
def test_a_packed_reference_member_is_its_torchdiffeq_run(cpu_twin, monkeypatch, name):
    """A pack of three on the CPU twin against each cell's eager run through torchdiffeq's
    ``odeint_adjoint`` (the CPU's recorded path): the same history (and evaluations counted)
    and weights within rounding."""
    seeds = [0, 1, 2]
    datas = [_data(s) for s in seeds]
    cfg = _cfg(epochs=3)
    models = [_model(name, s, **REFERENCE) for s in seeds]
    results = train_packed(models, [d[0] for d in datas], [d[1] for d in datas], cfg, seeds=seeds)
    assert all(r.packed_members == 3 for r in results)
    # the eager step, as the CPU trains these cells
    monkeypatch.setattr(packed_cells, "ADJOINT_PACKS_ON", ("cuda",))
    eager = _unpacked(name, seeds, cfg, datas, **REFERENCE)
    assert all(r.packed_members == 1 for _, r in eager)
    for e, p, d in zip(eager, zip(models, results, strict=True), datas, strict=True):
        _assert_same(e, p, d[2])


@pytest.mark.gpu
@pytest.mark.training
@pytest.mark.parametrize("name", ["node", "anode"])
def test_a_cuda_pack_of_reference_cells_is_captured_and_is_torchdiffeqs(name):
    """On CUDA a pack of the reference NODE/ANODE is captured into a CUDA graph and each member
    agrees with its eager CPU run through torchdiffeq's ``odeint_adjoint``."""
    seeds = [0, 1, 2]
    datas = [_data(s) for s in seeds]
    cfg = _cfg(epochs=3)
    models = [_model(name, s, **REFERENCE) for s in seeds]
    results = train_packed(
        models, [d[0] for d in datas], [d[1] for d in datas], cfg, seeds=seeds, device="cuda",
        graphs=True,
    )  # fmt: skip
    assert all(r.packed_members == 3 and r.graphs for r in results)
    eager = _unpacked(name, seeds, cfg, datas, **REFERENCE)
    for e, (m, r), d in zip(eager, zip(models, results, strict=True), datas, strict=True):
        _assert_same(e, (m.cpu(), r), d[2])


def test_a_packed_adjoint_step_reads_nothing_on_the_host_once_its_checks_are_recorded():
    """What a CUDA graph's capture needs, on the CPU twin: with the time grids' checks recorded
    on a first step and replayed (``recorded_host_bools``, as ``nltrain._packer`` captures), a
    step of a pack of the reference NODE reads no tensor value on the host (forward, the
    twin's backward solve, clipping and Adam)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from nlmodels.base import recorded_host_bools
    from nltrain import TrainConfig
    from nltrain._packed_cells import PackedCells

    reads = []

    class HostReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (
                torch.ops.aten._local_scalar_dense.default,
                torch.ops.aten.is_nonzero.default,
            ):
                reads.append(func)
            return func(*args, **(kwargs or {}))

    datas = [_data(s) for s in (0, 1)]
    cells = PackedCells(
        [_model("node", s, **REFERENCE).double() for s in (0, 1)], [d[0] for d in datas],
        [d[1] for d in datas], TrainConfig(epochs=1, patience=None, batch_size=8),
        torch.device("cpu"), [0, 1], ["0", "1"], False,
    )  # fmt: skip
    packer, pack = cells.packer, cells.pack
    cells.begin_epoch()
    idx = torch.arange(8).expand(2, -1).clone()
    tape: list[bool] = []
    with recorded_host_bools(tape, replay=False):
        packer.step(pack, idx, 8, packer.adam_scalars(1))
    assert tape  # the grids' checks were read once
    before = [p.detach().clone() for p in pack.params.values()]
    with recorded_host_bools(tape, replay=True), HostReads():
        packer.step(pack, idx, 8, packer.adam_scalars(2))
    assert reads == []
    assert any(not torch.equal(a, b) for a, b in zip(before, pack.params.values(), strict=True))
