"""Tests of the five baselines: NODE, ANODE, Latent ODE, Neural Flows (coupling, ResNet)."""

from __future__ import annotations

import itertools
import math
from functools import partial

import pytest
import torch
from scipy.linalg import expm
from torch import nn

import nlmodels.baselines  # noqa: F401  (registers the baselines)
from nlmodels.baselines import NODE, CouplingFlow, LatentODE, ResNetFlow
from nlmodels.baselines.neural_flows import TimeLinear, TimeTanh
from nlmodels.model_registry import build_model

torch.set_num_threads(1)
F64 = torch.float64
NAMES = ["node", "anode", "latent_ode", "nf_coupling", "nf_resnet"]
TABLE7 = {"node": 17025, "anode": 17282, "latent_ode": 18565, "nf_coupling": 18307,
          "nf_resnet": 18307}  # fmt: skip
A = torch.tensor([[-0.1, 1.0], [-1.0, -0.1]], dtype=F64)


class Linear(nn.Module):
    """Injected vector field f(t, x) = A x (input row is [t, x])."""

    def forward(self, tx: torch.Tensor) -> torch.Tensor:
        return tx[..., 1:] @ A.T


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def exact(x0: torch.Tensor, t0: float, times: torch.Tensor) -> torch.Tensor:
    """Analytic solution x(t) = exp(A (t − t0)) x0 for x0 [B, 2] → [B, T, 2]."""
    props = [torch.from_numpy(expm(A.numpy() * float(t - t0))) for t in times]
    return torch.stack([x0 @ P.T for P in props], dim=1)


def spiral(n_obs: int = 10, n_query: int = 10, batch: int = 1):
    t = torch.linspace(0, 4, n_obs + n_query, dtype=F64)
    phase = torch.linspace(0, 1, batch, dtype=F64)[:, None]
    x = torch.stack([torch.cos(t + phase), 0.5 * torch.sin(t + phase)], dim=-1)
    return t[:n_obs], x[:, :n_obs], t[n_obs:], x[:, n_obs:]


# ---------------------------------------------------------------- registry and sizes


def test_unknown_name_lists_valid_models():
    with pytest.raises(ValueError, match="unknown model 'nodee'") as err:
        build_model("nodee", 2)
    for name in NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_match_table7(name):
    count = n_params(build_model(name, 1))
    assert abs(count / TABLE7[name] - 1) < 0.10, count
    if name in ("node", "anode"):  # these two are fully specified by the paper
        assert count == TABLE7[name]


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match=r"valid solvers: .*dopri5"):
        build_model("node", 2, solver="rk45")
    model = build_model("node", 2)
    ot, ox, qt, _ = spiral()
    with pytest.raises(ValueError, match="state dimension 2, model expects 3"):
        build_model("nf_coupling", 3)(ot, ox, qt)
    with pytest.raises(ValueError, match="strictly increasing"):
        model.double()(ot, ox, qt.flip(0))
    with pytest.raises(ValueError, match="precede"):
        model(ot, ox, ot[:3])
    with pytest.raises(ValueError, match="lipschitz"):
        ResNetFlow(2, lipschitz=1.0)


# ---------------------------------------------------------------- shapes and gradients


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("per_sample", [False, True])
def test_shapes_and_finite_gradients(name, per_sample):
    torch.manual_seed(0)
    model = build_model(name, 2).double()
    ot, ox, qt, target = spiral(batch=3)
    if per_sample:  # shifted and stretched grids per trajectory
        shift = torch.tensor([[0.0], [0.3], [-0.2]], dtype=F64)
        ot, qt = ot + shift, qt * torch.tensor([[1.0], [1.1], [0.9]], dtype=F64) + shift
    pred = model(ot, ox, qt)
    assert pred.shape == (3, 10, 2) and pred.dtype == F64
    assert model.nfe > 0
    loss = model.training_loss(ot, ox, qt, target)
    loss.backward()
    assert torch.isfinite(loss)
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
    assert sum(float(p.grad.abs().sum()) for p in model.parameters()) > 0
    model.reset_nfe()
    assert model.nfe == 0


# ---------------------------------------------------------------- NODE against analytic solutions


def test_node_matches_linear_ode_with_dopri5():
    model = NODE(2, vector_field=Linear(), solver="dopri5", rtol=1e-10, atol=1e-10)
    x0 = torch.tensor([[1.0, 0.0], [0.3, -2.0]], dtype=F64)
    ot = torch.tensor([0.0, 0.5], dtype=F64)
    qt = torch.linspace(0.7, 10.0, 15, dtype=F64)
    ox = torch.stack([torch.zeros_like(x0), x0], dim=1)  # the last observation is x0 at t = 0.5
    err = (model(ot, ox, qt) - exact(x0, 0.5, qt)).abs().max()
    assert err < 1e-6
    # per-sample grids (different start and query times) go through the time reparametrisation
    ot2 = torch.stack([ot, ot + 1.0])
    qt2 = torch.stack([qt, 2 * qt + 0.2])
    pred = model(ot2, ox, qt2)
    assert (pred[0] - exact(x0[:1], 0.5, qt)[0]).abs().max() < 1e-6
    assert (pred[1] - exact(x0[1:], 1.5, 2 * qt + 0.2)[0]).abs().max() < 1e-6


def test_node_euler_converges_at_first_order():
    model = NODE(2, vector_field=Linear())  # euler on the prediction grid
    x0 = torch.tensor([[1.0, 0.5]], dtype=F64)
    ox = x0[:, None]
    errs = []
    for n in (50, 100, 200):
        qt = torch.linspace(0, 5, n + 1, dtype=F64)[1:]
        errs.append(float((model(torch.zeros(1, dtype=F64), ox, qt)[0, -1] -
                           exact(x0, 0.0, qt[-1:])[0, -1]).norm()))  # fmt: skip
    assert errs[0] > 1e-3  # Euler is far from exact at this step size
    for coarse, fine in itertools.pairwise(errs):
        assert 1.8 < coarse / fine < 2.2


@pytest.mark.parametrize("solver,tol", [("euler", 1e-12), ("dopri5", 1e-6)])
def test_per_sample_grids_match_rowwise_solves(solver, tol):
    torch.manual_seed(1)
    model = build_model("node", 2, hidden=(16,), solver=solver, rtol=1e-9, atol=1e-9).double()
    ox = torch.randn(3, 4, 2, dtype=F64)
    ot = torch.linspace(0, 1, 4, dtype=F64) + torch.tensor([[0.0], [0.5], [2.0]], dtype=F64)
    qt = ot[:, -1:] + torch.tensor([[0.1, 0.4, 1.0], [0.2, 0.3, 2.0], [0.5, 0.6, 0.7]], dtype=F64)
    batched = model(ot, ox, qt)
    for b in range(3):  # the reference: each trajectory on its own shared grid
        assert (batched[b] - model(ot[b], ox[b : b + 1], qt[b])[0]).abs().max() < tol


def test_equal_rows_use_the_shared_grid():
    model = build_model("node", 2).double()
    ot, ox, qt, _ = spiral(batch=2)
    shared = model(ot, ox, qt)
    model.reset_nfe()
    rows = model(ot.expand(2, -1), ox, qt.expand(2, -1))
    assert torch.equal(shared, rows) and model.nfe == 10  # one Euler step per query interval


def test_adjoint_gradients_match_direct_backprop():
    torch.manual_seed(2)
    kw = dict(hidden=(16, 16), solver="dopri5", rtol=1e-10, atol=1e-10)
    direct = build_model("anode", 2, **kw).double()
    adjoint = build_model("anode", 2, adjoint=True, **kw).double()
    adjoint.load_state_dict(direct.state_dict())
    ot, ox, qt, target = spiral(batch=2)
    grads = []
    for model in (direct, adjoint):
        model.training_loss(ot, ox, qt, target).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-8)


def test_gradcheck_node_euler_and_coupling_flow():
    torch.manual_seed(3)
    model = build_model("node", 2, hidden=(6,)).double()
    ot, ox, qt, _ = spiral(n_obs=3, n_query=3)
    ox = ox.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: model(ot, x, qt), (ox,))
    flow = CouplingFlow(3, hidden=(5,)).double()
    t = torch.rand(4, dtype=F64, requires_grad=True)
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(flow, (t, x))


# ---------------------------------------------------------------- flows


@pytest.mark.parametrize("time_net", ["tanh", "linear"])
def test_coupling_flow_is_exactly_invertible(time_net):
    torch.manual_seed(4)
    flow = CouplingFlow(4, time_net=time_net).double()
    t = 3 * torch.randn(50, dtype=F64)
    x = torch.randn(50, 4, dtype=F64)
    y = flow(t, x)
    assert (y - x).abs().max() > 1e-2  # a non-trivial map away from t = 0
    assert (flow.inverse(t, y) - x).abs().max() < 1e-10


@pytest.mark.parametrize("time_net", ["tanh", "linear"])
@pytest.mark.parametrize("flow_cls", [CouplingFlow, ResNetFlow])
def test_flows_are_identity_at_time_zero(flow_cls, time_net):
    torch.manual_seed(5)
    flow = flow_cls(5, time_net=time_net).double()
    x = torch.randn(7, 3, 5, dtype=F64)
    assert torch.equal(flow(torch.zeros(7, 3, dtype=F64), x), x)
    assert (flow(torch.full((7, 3), 0.5, dtype=F64), x) - x).abs().max() > 1e-3


def test_linear_time_functions_grow_where_tanh_saturates():
    torch.manual_seed(7)
    tanh, linear = TimeTanh(8).double(), TimeLinear(8).double()
    linear.load_state_dict(tanh.state_dict())  # the same frequencies ω
    t = torch.tensor([-3.0, 0.0, 0.5, 12.0, 20.0], dtype=F64)
    omega_t = t.unsqueeze(-1) * tanh.freq
    assert torch.equal(linear(t), omega_t) and torch.equal(tanh(t), torch.tanh(omega_t))
    # over a forecast window far from t = 0 the tanh features barely move, the linear ones do
    assert (tanh(t[4:]) - tanh(t[3:4])).abs().min() < 0.01
    assert ((linear(t[4:]) - linear(t[3:4])) - 8 * tanh.freq).abs().max() < 1e-12


def test_resnet_flow_with_linear_time_inverts_where_it_contracts():
    torch.manual_seed(8)
    flow = ResNetFlow(3, time_net="linear").double().eval()  # eval: no power iterations between
    x = torch.randn(20, 3, dtype=F64)
    t = torch.full((20,), 0.5, dtype=F64)  # |ω t| · c < 1 for the initial ω ≤ 1
    y = flow(t, x)
    assert (y - x).abs().max() > 1e-3
    assert (flow.inverse(t, y) - x).abs().max() < 1e-10


@pytest.mark.parametrize("method", ["nf_coupling", "nf_resnet"])
def test_unknown_time_function_is_refused_by_name(method):
    refusal = r"time_net must be one of \('tanh', 'linear'\), got 'relu'"
    with pytest.raises(ValueError, match=refusal):
        build_model(method, 2, time_net="relu")


def _spectral_layers(model: nn.Module) -> list[nn.Linear]:
    return [
        m for m in model.modules() if isinstance(m, nn.Linear) and hasattr(m, "parametrizations")
    ]


@pytest.mark.training
def test_resnet_flow_stays_contractive_after_training_steps():
    torch.manual_seed(6)
    model = build_model("nf_resnet", 2).double()
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)  # large steps move weights a lot
    ot, ox, qt, target = spiral(batch=4)
    for _ in range(25):
        opt.zero_grad()
        model.training_loss(ot, ox, qt, 5 * target).backward()
        opt.step()
    layers = _spectral_layers(model)
    assert len(layers) == 2 * 2 * 3  # two flows × two layers × three linear maps
    sigmas = torch.stack([torch.linalg.matrix_norm(lin.weight.detach(), ord=2) for lin in layers])
    # one power iteration per step lags the weights only slightly, and the factor c = 0.9 absorbs
    # the lag: c · Π σ_i bounds the Lipschitz constant of each residual in x
    assert (sigmas < 1.05).all(), sigmas
    assert (0.9 * sigmas.view(-1, 3).prod(dim=1) < 1.0).all(), sigmas
    # the residual of each layer is a contraction in x: Jacobian norm < 1 at random points
    for flow in (model.hidden_flow, model.latent_flow):
        dim = flow.layers[0].gate.freq.numel()
        for layer in flow.layers:
            for t in (0.3, 5.0, -40.0):
                x = torch.randn(dim, dtype=F64)
                tt = torch.tensor(t, dtype=F64)
                jac = torch.autograd.functional.jacobian(partial(layer.residual, tt), x)
                assert torch.linalg.matrix_norm(jac, ord=2) < 1.0
        y = torch.randn(6, dim, dtype=F64)
        tt = torch.full((6,), 2.0, dtype=F64)
        assert (flow(tt, flow.inverse(tt, y)) - y).abs().max() < 1e-8


# ---------------------------------------------------------------- training


@pytest.mark.training
def test_latent_ode_elbo_is_finite_and_decreases():
    torch.manual_seed(7)
    model = LatentODE(2).double()
    ot, ox, qt, target = spiral(batch=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = model.training_loss(ot, ox, qt, target)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.2 * first


@pytest.mark.training
@pytest.mark.parametrize("name", NAMES)
def test_each_model_fits_a_single_trajectory(name):
    torch.manual_seed(0)
    model = build_model(name, 2).double()
    ot, ox, qt, target = spiral()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch.no_grad():
        before = float(((model(ot, ox, qt) - target) ** 2).mean())
    for _ in range(200 if name == "latent_ode" else 300):
        opt.zero_grad()
        model.training_loss(ot, ox, qt, target).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    with torch.no_grad():
        after = float(((model(ot, ox, qt) - target) ** 2).mean())
    assert after < before / 20, (before, after)


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("name", "settings"),
    [*((name, {}) for name in NAMES)]
    + [(name, {"time_net": "linear"}) for name in ("nf_coupling", "nf_resnet")],  # the paper's
)
def test_cuda_smoke(name, settings):
    dev = torch.device("cuda")
    model = build_model(name, 2, **settings).double().to(dev)
    ot, ox, qt, target = (v.to(dev) for v in spiral(batch=3))
    shift = torch.tensor([[0.0], [0.3], [0.6]], dtype=F64, device=dev)
    for o, q in ((ot, qt), (ot + shift, qt + shift)):
        pred = model(o, ox, q)
        assert pred.device.type == "cuda" and pred.dtype == F64
        loss = model.training_loss(o, ox, q, target)
        loss.backward()
        assert torch.isfinite(loss)
        assert all(p.grad.device.type == "cuda" for p in model.parameters())


def test_neural_flows_train_concurrently_in_threads():
    """Spectral-norm weights are cached per forward pass; two models in two threads must not
    share that cache (the failure was 'backward through the graph a second time')."""
    import threading

    errors: list[BaseException] = []

    def fit(seed: int) -> None:
        try:
            torch.manual_seed(seed)
            model = build_model("nf_resnet", state_dim=2).double()
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            t = torch.linspace(0.1, 2.0, 12, dtype=torch.float64)
            x = torch.randn(4, 12, 2, dtype=torch.float64)
            for _ in range(15):
                opt.zero_grad()
                model.training_loss(t[:6], x[:, :6], t[6:], x[:, 6:]).backward()
                opt.step()
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=fit, args=(s,)) for s in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


@pytest.mark.parametrize("z0_time", ["first_observed", "first_query"])
def test_latent_ode_places_z0_where_asked(z0_time):
    """The prediction at the first query time is the decoded z₀ itself with ``first_query``
    (the reference code's solve starts there), and z₀ carried across the observed window by
    an independent solve (torchdiffeq) with ``first_observed``."""
    from torchdiffeq import odeint

    torch.manual_seed(3)
    model = LatentODE(2, z0_time=z0_time, rtol=1e-10, atol=1e-10).double()
    ot, ox, qt, _ = spiral(batch=3)
    with torch.no_grad():
        pred = model(ot, ox, qt)
        z0, _ = model.encode(ot, ox)
        if z0_time == "first_query":
            expected = model.decoder(z0)
        else:
            t = torch.stack([ot[0], qt[0]])  # a shared grid
            z = odeint(lambda _t, z: model.latent_field(z), z0, t, rtol=1e-10, atol=1e-10)[-1]
            expected = model.decoder(z)
    torch.testing.assert_close(pred[:, 0], expected, rtol=0, atol=1e-8)


def test_latent_ode_refuses_an_unknown_choice_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"z0_time must be one of .*'first_query'.*got 'first'"):
        LatentODE(2, z0_time="first")
    with pytest.raises(ValueError, match=r"kl_average must be one of .*'latents'.*got 'sum'"):
        LatentODE(2, kl_average="sum")


def test_latent_ode_samples_do_not_depend_on_other_draws_in_the_process():
    """The ELBO's sample comes from the model's own stream: a neighbour drawing from the global
    generator between steps (another model training in a thread) leaves its losses as they were."""
    ot, ox, qt, target = spiral(batch=4)

    def losses(interleave: bool) -> list[float]:
        torch.manual_seed(3)
        model = LatentODE(2).double()
        out = []
        for _ in range(3):
            if interleave:
                torch.randn(1000)
            with torch.no_grad():
                out.append(float(model.training_loss(ot, ox, qt, target)))
        return out

    alone = losses(interleave=False)
    assert losses(interleave=True) == alone
    assert len(set(alone)) == 3  # a fresh sample each step, not one fixed draw


def test_latent_ode_kl_weighting_matches_the_formula():
    """Negative ELBO per value; the KL term's weight is 1/(T_q·D) ("values") or 1/K
    ("latents", the reference's mean over latent dimensions)."""
    ot, ox, qt, target = spiral(batch=4)
    losses = {}
    for kl_average in ("values", "latents"):
        torch.manual_seed(5)
        model = LatentODE(2, kl_average=kl_average).double()
        with torch.no_grad():
            model.reseed(11)
            loss = model.training_loss(ot, ox, qt, target)
            mean, std = model.encode(ot, ox)
            eps = torch.randn(std.shape, generator=torch.Generator().manual_seed(11), dtype=F64)
            z0 = mean + std * eps
            pred = model.decode(ot[:1].expand(4), z0, qt.expand(4, -1))
        var = model.obs_std**2
        nll = 0.5 * ((target - pred) ** 2 / var + math.log(2 * math.pi * var)).mean(dim=(1, 2))
        kl = 0.5 * (mean**2 + std**2 - 1 - 2 * torch.log(std)).sum(-1)
        per = target[0].numel() if kl_average == "values" else model.latent_dim
        torch.testing.assert_close(loss, (nll + kl / per).mean(), rtol=1e-12, atol=0)
        losses[kl_average] = loss
    assert losses["latents"] > losses["values"]  # the KL is positive and weighs more per latent
