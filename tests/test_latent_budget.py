"""dopri5 on a fixed budget of iterations (the solve a CUDA graph captures), on the CPU twin:
against exact solutions and torchdiffeq, against the solve without a budget, and the Latent
ODE packed and alone under it; the capture itself on CUDA (``gpu``)."""

from __future__ import annotations

import pytest
import torch
from test_packing import _cfg, _data, _model, _packed
from torchdiffeq import odeint

from nlmodels.base import recorded_host_bools
from nlmodels.baselines._dopri import dopri5_lanes
from nlmodels.baselines.latent_ode import CAPTURE_FLOOR, CAPTURE_HEADROOM
from nltrain import TrainResult, train, train_packed
from nltrain._packed_cells import PackedCells

SMALL = {"rec_units": 8, "rec_hidden": (8,), "head_hidden": (8,), "ode_hidden": (8, 8)}
F64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _needed(sol) -> int:
    return int((sol.accepted + sol.rejected).max())


def test_exponential_decay_on_a_budget_is_exact_to_the_tolerance():
    # dy/dt = -k y, one rate per lane: lanes of different stiffness need different steps.
    rates = torch.tensor([0.1, 1.0, 8.0], dtype=F64)
    y0 = torch.tensor([[1.0, -2.0], [0.5, 3.0], [2.0, 1.0]], dtype=F64).unsqueeze(1)  # [L, 1, 2]
    t = torch.linspace(0.0, 3.0, 7, dtype=F64).expand(3, -1)

    def field(t, y):
        return -rates.view(3, 1, 1) * y

    free = dopri5_lanes(field, y0, t[:, 0], t[:, 1:], rtol=1e-10, atol=1e-12, masked=True)
    budget = _needed(free) + 5
    sol = dopri5_lanes(field, y0, t[:, 0], t[:, 1:], rtol=1e-10, atol=1e-12, iterations=budget)
    exact = y0.unsqueeze(1) * torch.exp(-rates.view(3, 1, 1, 1) * t[:, 1:].reshape(3, 6, 1, 1))
    torch.testing.assert_close(sol.y, exact, rtol=0, atol=1e-9)
    assert sol.iterations == budget and not sol.unfinished.any()
    assert len(set(sol.accepted.tolist())) == 3  # each lane kept its own step sizes


def test_a_linear_system_on_a_budget_matches_the_matrix_exponential_and_torchdiffeq():
    a = torch.tensor([[-0.1, 2.0], [-2.0, -0.3]], dtype=F64)
    y0 = torch.tensor([[1.0, 0.0], [0.3, -2.0]], dtype=F64)
    t = torch.tensor([0.0, 0.7, 1.5, 4.0, 10.0], dtype=F64)
    sol = dopri5_lanes(
        lambda t, y: y @ a.T, y0[None], t[:1], t[None, 1:], rtol=1e-10, atol=1e-12, iterations=5000
    )
    exact = torch.stack([y0 @ torch.linalg.matrix_exp(a * s).T for s in t[1:]])
    torch.testing.assert_close(sol.y[0], exact, rtol=0, atol=1e-8)
    counted = {"accepted": 0}

    class Field(torch.nn.Module):
        def forward(self, t, y):
            return y @ a.T

        def callback_accept_step(self, t0, y0, dt):
            counted["accepted"] += 1

    reference = odeint(Field(), y0, t, rtol=1e-10, atol=1e-12, method="dopri5")[1:]
    torch.testing.assert_close(sol.y[0], reference, rtol=0, atol=1e-12)
    assert int(sol.accepted[0]) == counted["accepted"]


def _nonlinear(seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(3, 3, generator=gen, dtype=F64, requires_grad=True)
    y0 = torch.randn(4, 5, 3, generator=gen, dtype=F64) * torch.tensor([0.1, 1, 3, 6]).view(
        4, 1, 1
    ).to(F64)
    y0.requires_grad_(True)
    t = torch.linspace(0.0, 4.0, 9, dtype=F64).expand(4, -1)

    def field(t, y):
        return torch.tanh(y @ w) * torch.cos(2 * t).view(-1, 1, 1) - 0.1 * y

    return field, w, y0, t


def test_a_sufficient_budget_gives_the_unbudgeted_solve_bit_for_bit():
    field, w, y0, t = _nonlinear(0)
    weights = torch.randn(4, 8, 5, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    free = dopri5_lanes(field, y0, t[:, 0], t[:, 1:], rtol=1e-5, atol=1e-7, masked=True)
    free_grads = torch.autograd.grad((free.y * weights).sum(), [w, y0])
    needed = _needed(free)
    assert len(set((free.accepted + free.rejected).tolist())) > 1
    for budget in (needed, needed + 1, 3 * needed):
        sol = dopri5_lanes(field, y0, t[:, 0], t[:, 1:], rtol=1e-5, atol=1e-7, iterations=budget)
        assert torch.equal(sol.y, free.y) and torch.equal(sol.nfe, free.nfe)
        assert not sol.unfinished.any()
        grads = torch.autograd.grad((sol.y * weights).sum(), [w, y0])
        for g, f in zip(grads, free_grads, strict=True):
            assert torch.equal(g, f)


def test_a_short_budget_flags_the_unfinished_lanes_and_leaves_their_later_outputs_nan():
    field, _, y0, t = _nonlinear(2)
    free = dopri5_lanes(field, y0, t[:, 0], t[:, 1:], rtol=1e-5, atol=1e-7, masked=True)
    per_lane = free.accepted + free.rejected
    budget = int(per_lane.min())  # the easiest lane finishes, the hardest does not
    sol = dopri5_lanes(field, y0, t[:, 0], t[:, 1:], rtol=1e-5, atol=1e-7, iterations=budget)
    assert sol.unfinished.tolist() == (per_lane > budget).tolist()
    assert sol.unfinished.any() and not sol.unfinished.all()
    for lane in range(4):
        if sol.unfinished[lane]:
            assert torch.isnan(sol.y[lane, -1]).all()
        else:
            assert torch.equal(sol.y[lane], free.y[lane])
    with pytest.raises(ValueError, match="iterations must be >= 1"):
        dopri5_lanes(field, y0, t[:, 0], t[:, 1:], rtol=1e-5, atol=1e-7, iterations=0)


def _budgeted(models, budget):
    for m in models:
        m.solve_iterations = budget
    return models


def _exactly_equal(a, b) -> None:
    (ma, ra), (mb, rb) = a, b
    assert isinstance(ra, TrainResult) and isinstance(rb, TrainResult)
    assert [(e.train_loss, e.val_loss, e.val_rmse, e.nfe) for e in ra.history] == [
        (e.train_loss, e.val_loss, e.val_rmse, e.nfe) for e in rb.history
    ]
    for (na, ta), (nb, tb) in zip(ma.state_dict().items(), mb.state_dict().items(), strict=True):
        assert na == nb and torch.equal(ta, tb)


@pytest.mark.heavy  # packs and members trained alone, twice (the linear system's oracle stays)
@pytest.mark.training
@pytest.mark.parametrize("settings", [{}, {"z0_time": "first_query", "kl_average": "latents"}])
def test_the_latent_ode_on_a_budget_trains_as_without_it_packed_or_alone(settings):
    """Bit for bit: members packed under a fixed budget equal each trained alone under it (a
    pack of one, ``step="packed"``: the engine's contract, the same batched kernels; the
    module's own eager step on the CPU rounds otherwise), and a sufficient budget changes no
    bit of training, packed or alone (a frozen lane's extra iterations add exact zeros)."""
    seeds, cfg = [0, 1, 2], _cfg(epochs=3, lr=0.05)
    datas = [_data(s) for s in seeds]
    kw = {**SMALL, **settings}
    free = _packed("latent_ode", seeds, cfg, datas, **kw)
    models = _budgeted([_model("latent_ode", s, **kw) for s in seeds], 64)
    packed = train_packed(models, [d[0] for d in datas], [d[1] for d in datas], cfg, seeds=seeds)
    assert all(r.packed_members == 3 for r in packed)
    for s, (tr, va, _), together, unbudgeted in zip(seeds, datas, zip(models, packed), free):
        _exactly_equal(unbudgeted, together)
        runs = []
        for budget in (64, None):
            (alone,) = _budgeted([_model("latent_ode", s, **kw)], budget)
            result = train(alone, tr, va, cfg, seed=s, label=f"m{s}", step="packed")
            runs.append((alone, result))
        _exactly_equal(*runs)
        _exactly_equal(runs[0], together)


def test_a_budget_too_short_is_an_error_not_a_divergence():
    seeds, cfg = [0, 1], _cfg(epochs=2, lr=0.05)
    datas = [_data(s) for s in seeds]
    models = _budgeted([_model("latent_ode", s, **SMALL) for s in seeds], 1)
    with pytest.raises(RuntimeError, match="fixed budget of dopri5 iterations"):
        train_packed(models, [d[0] for d in datas], [d[1] for d in datas], cfg, seeds=seeds)


def test_a_captures_warm_up_chooses_the_budget_and_each_epoch_end_reads_the_replays():
    """The policy a capture follows, on the CPU twin: the warm-up (host reads recorded) counts
    the iterations its solves need and counts no evaluation; an epoch's end hands the members
    what the device counted, raises the peak from it, says when a solve outgrew its budget, and
    asks for a new capture once the replays needed more than half of it."""
    seeds, cfg = [0, 1], _cfg(epochs=1)
    datas = [_data(s) for s in seeds]
    models = [_model("latent_ode", s, **SMALL).double() for s in seeds]
    cells = PackedCells(
        models, [d[0] for d in datas], [d[1] for d in datas], cfg, torch.device("cpu"),
        seeds, ["m0", "m1"], False,
    )  # fmt: skip
    base = cells.packer.base
    cells.begin_epoch()
    with recorded_host_bools([], replay=False):
        cells.train_step(0, 0, 8)
    assert [m.nfe for m in models] == [0, 0]  # the warm-up counts nothing
    peak = base._peak_iterations
    assert 0 < peak < 8 and base.capture_iterations() == CAPTURE_FLOOR
    overrun, needed = base._flags
    # What replays would leave on the device: evaluations per member, the most iterations.
    base._lane_nfe += torch.tensor([20, 26])
    needed.fill_(8)
    base._captured_budget = CAPTURE_FLOOR
    assert base.graph_epoch_end(models) is None
    assert [m.nfe for m in models] == [20, 26] and not base._lane_nfe.any()
    assert base._peak_iterations == 8 and not base.graph_recapture()  # 8: half of 16
    needed.fill_(13)
    overrun.fill_(True)
    assert "needed more than it (13 at least)" in base.graph_epoch_end(models)
    assert base.graph_recapture() and base._captured_budget is None
    assert base.capture_iterations() == CAPTURE_HEADROOM * 13 and not overrun


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_latent_ode_is_captured_on_cuda_and_trains_as_its_eager_steps():
    """The captured pack (a fixed budget chosen from the warm-up) against the same pack's eager
    CUDA steps: the same solve where the budget suffices, so the same training up to the
    GPU's reductions (graph and eager kernels may sum in another order)."""
    seeds, cfg = [0, 1, 2], _cfg(epochs=3, lr=0.05)
    datas = [_data(s) for s in seeds]
    runs = {}
    for graphs in (True, False):
        models = [_model("latent_ode", s, **SMALL) for s in seeds]
        runs[graphs] = list(
            zip(
                models,
                train_packed(
                    models,
                    [d[0] for d in datas],
                    [d[1] for d in datas],
                    cfg,
                    device="cuda",
                    seeds=seeds,
                    graphs=graphs,
                ),
                strict=True,
            )
        )
    assert all(r.graphs for _, r in runs[True]) and not any(r.graphs for _, r in runs[False])
    for (mg, rg), (me, re_) in zip(runs[True], runs[False], strict=True):
        for eg, ee in zip(rg.history, re_.history, strict=True):
            assert eg.nfe == ee.nfe  # the replays' evaluations, counted on the device
            assert eg.train_loss == pytest.approx(ee.train_loss, rel=1e-6)
            assert eg.val_rmse == pytest.approx(ee.val_rmse, rel=1e-6)
        for (n, tg), (_, te) in zip(mg.state_dict().items(), me.state_dict().items()):
            torch.testing.assert_close(tg, te, rtol=1e-6, atol=1e-8, msg=n)
