"""Neural Laplace model: shapes, the fused decoder against the plain path, gradients, fitting."""

import pytest
import torch

from nlmodels import NeuralLaplace, build_model

torch.set_num_threads(1)


def _data(batch=5, n_obs=12, n_query=9, dim=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs_t = torch.linspace(0.1, 2.0, n_obs, dtype=torch.float64)
    query_t = torch.linspace(2.1, 4.0, n_query, dtype=torch.float64)
    obs_x = torch.randn(batch, n_obs, dim, generator=g, dtype=torch.float64)
    return obs_t, obs_x, query_t


def _plain_decode(model: NeuralLaplace, p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Reference path: F at the query points, then the ILT's own reconstruct (no fusion)."""
    s = model.ilt.query(t)
    fs = model.laplace.evaluate(model.laplace.query_features(s), p)  # [B, T, D, Q]
    t_b = t.unsqueeze(-2) if t.dim() == 2 else t
    return model.ilt.reconstruct(fs.transpose(1, 2), t_b).transpose(1, 2)


def test_reference_parameter_count():
    # the reference implementation's count: 21,547 for D = 2 with H = 64 (encoder 4,391, g 17,156)
    model = NeuralLaplace(2)
    assert sum(p.numel() for p in model.encoder.parameters()) == 4391
    assert sum(p.numel() for p in model.laplace.parameters()) == 17156


@pytest.mark.parametrize("per_sample_obs", [False, True])
@pytest.mark.parametrize("per_sample_query", [False, True])
def test_shapes_for_all_input_forms(per_sample_obs, per_sample_query):
    obs_t, obs_x, query_t = _data()
    model = NeuralLaplace(2, encode_times=True).double()
    if per_sample_obs:
        obs_t = obs_t.expand(5, -1) + 0.01 * torch.arange(5, dtype=torch.float64)[:, None]
    if per_sample_query:
        query_t = query_t.expand(5, -1) * (1 + 0.1 * torch.arange(5, dtype=torch.float64)[:, None])
    y = model(obs_t, obs_x, query_t)
    assert y.shape == (5, 9, 2) and y.dtype == torch.float64
    assert model.encode(obs_t, obs_x).shape == (5, 2)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("stereographic", [True, False])
def test_fused_decoder_equals_plain_ilt_path(stereographic):
    torch.manual_seed(0)
    model = NeuralLaplace(3, latent_dim=4, stereographic=stereographic).double()
    p = torch.randn(11, 4, dtype=torch.float64)
    t = torch.linspace(0.05, 30.0, 37, dtype=torch.float64)
    torch.testing.assert_close(
        model.decode(p, t), _plain_decode(model, p, t), rtol=1e-11, atol=1e-11
    )
    t_b = t.expand(11, -1) * torch.linspace(0.5, 1.5, 11, dtype=torch.float64)[:, None]
    torch.testing.assert_close(
        model.decode(p, t_b), _plain_decode(model, p, t_b), rtol=1e-11, atol=1e-11
    )


def _values_and_grads(model, obs_t, obs_x, query_t):
    model.zero_grad()
    y = model(obs_t, obs_x, query_t)
    (y * torch.sin(y)).sum().backward()
    return [y.detach()] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("native", ["auto", "0"])
def test_plain_formulas_equal_the_fast_paths(monkeypatch, per_sample, native):
    # Under torch.compile the model runs its plain formulas (nn.GRU, g, the ILT sum): the same
    # values and gradients as the fast paths (native kernels or their torch twins).
    monkeypatch.setenv("NLLAB_NATIVE", native)
    torch.manual_seed(5)
    model = NeuralLaplace(2, terms=17).double()
    obs_t, obs_x, query_t = _data(batch=6)
    if per_sample:
        query_t = query_t * torch.linspace(0.7, 1.3, 6, dtype=torch.float64)[:, None]
    fast = _values_and_grads(model, obs_t, obs_x, query_t)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    plain = _values_and_grads(model, obs_t, obs_x, query_t)
    for a, b in zip(fast, plain):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.slow
def test_torch_compile_trains_the_same_model():
    torch.manual_seed(6)
    model = NeuralLaplace(2, terms=9, laplace_units=8, encoder_units=4).double()
    obs_t, obs_x, query_t = _data(batch=4)
    eager = _values_and_grads(model, obs_t, obs_x, query_t)
    compiled_model = torch.compile(model)
    compiled = _values_and_grads(compiled_model, obs_t, obs_x, query_t)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # the evaluation counter and the grid cache stay eager: counted at every call, and the
    # graph is not compiled again for each new count
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    model.reset_nfe()
    for _ in range(3):
        compiled_model(obs_t, obs_x, query_t)
    assert model.nfe == 3 and counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("per_sample", [False, True])
def test_gradcheck_through_the_whole_model(per_sample):
    torch.manual_seed(1)
    model = NeuralLaplace(2, laplace_units=6, encoder_units=4, terms=7).double()
    obs_t, obs_x, query_t = _data(batch=3, n_obs=4, n_query=3)
    if per_sample:
        query_t = query_t.expand(3, -1) + torch.tensor([[0.0], [0.3], [1.1]], dtype=torch.float64)
    params = tuple(model.parameters())

    def f(*ps):
        with torch.no_grad():
            for dst, src in zip(params, ps):
                dst.copy_(src)
        return model(obs_t, obs_x, query_t)

    # gradcheck on the parameters through torch.func: compare analytic with finite differences
    loss_grads = torch.autograd.grad(model(obs_t, obs_x, query_t).square().sum(), params)
    eps = 1e-6
    g = torch.Generator().manual_seed(3)
    for param, grad in zip(params, loss_grads):
        direction = torch.randn(param.shape, generator=g, dtype=torch.float64)
        with torch.no_grad():
            param.add_(eps * direction)
            up = model(obs_t, obs_x, query_t).square().sum()
            param.sub_(2 * eps * direction)
            down = model(obs_t, obs_x, query_t).square().sum()
            param.add_(eps * direction)
        numeric = (up - down) / (2 * eps)
        analytic = (grad * direction).sum()
        assert abs(numeric - analytic) <= 1e-6 * (1 + abs(analytic)), (numeric, analytic)
    p = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p: model.decode(p, query_t), (p,))


def test_non_linear_ilt_path_dehoog():
    torch.manual_seed(0)
    model = NeuralLaplace(2, ilt="dehoog").double()
    obs_t, obs_x, query_t = _data()
    y = model(obs_t, obs_x, query_t)
    assert y.shape == (5, 9, 2) and torch.isfinite(y).all()
    y.square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_decoding_is_pointwise_in_time_and_counts_one_evaluation_per_call():
    torch.manual_seed(0)
    model = NeuralLaplace(2).double()
    p = torch.randn(4, 2, dtype=torch.float64)
    grid = torch.linspace(0.5, 100.0, 200, dtype=torch.float64)
    full = model.decode(p, grid)
    model.reset_nfe()
    far = model.decode(p, grid[[7, 150, 199]])
    torch.testing.assert_close(far, full[:, [7, 150, 199]], rtol=1e-12, atol=1e-12)
    assert model.nfe == 1
    model.decode(p, torch.tensor([1000.0], dtype=torch.float64))
    assert model.nfe == 2


def test_the_grid_cache_never_serves_stale_terms():
    torch.manual_seed(5)
    model = NeuralLaplace(2).double()
    p = torch.randn(3, 2, dtype=torch.float64)
    grid = torch.linspace(0.5, 4.0, 7, dtype=torch.float64)
    first = model.decode(p, grid)
    torch.testing.assert_close(model.decode(p, grid.clone()), first, rtol=0, atol=0)
    grid.mul_(2.0)  # edited in place: the terms must follow
    fresh = NeuralLaplace(2).double()
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(model.decode(p, grid), fresh.decode(p, grid), rtol=0, atol=0)
    assert not torch.allclose(model.decode(p, grid), first)
    # another dtype gets its own terms
    assert model.float().decode(p.float(), grid).dtype == torch.float32


def test_low_pass_bounds_the_laplace_representation():
    torch.manual_seed(0)
    model = NeuralLaplace(1, max_frequency=3.0).double()
    with torch.no_grad():
        for prm in model.laplace.parameters():
            prm.mul_(20)  # drive the tanh outputs to saturation
    p = torch.randn(6, 2, dtype=torch.float64)
    s = model.ilt.query(torch.linspace(0.1, 5, 20, dtype=torch.float64))
    fs = model.laplace.evaluate(model.laplace.query_features(s), p)
    assert fs.abs().max().item() <= 3.0 + 1e-9
    assert fs.abs().max().item() > 2.5  # the bound is reached, not just respected


def test_float32_and_registry():
    model = build_model("neural_laplace", state_dim=2, latent_dim=3)
    assert isinstance(model, NeuralLaplace) and model.latent_dim == 3
    obs_t, obs_x, query_t = _data()
    y = model(obs_t.float(), obs_x.float(), query_t.float())
    assert y.dtype == torch.float32 and torch.isfinite(y).all()


def test_bad_input_is_rejected_clearly():
    with pytest.raises(ValueError, match="unknown ILT"):
        NeuralLaplace(2, ilt="laplace-magic")
    with pytest.raises(ValueError, match="latent_dim"):
        NeuralLaplace(2, latent_dim=0)
    with pytest.raises(ValueError, match="stereographic"):
        NeuralLaplace(2, stereographic=False, max_frequency=3.0)
    model = NeuralLaplace(2).double()
    obs_t, obs_x, query_t = _data()
    with pytest.raises(ValueError, match="obs_x"):
        model(obs_t, obs_x[..., :1], query_t)
    with pytest.raises(ValueError, match="> 0"):
        model(obs_t, obs_x, query_t - 10)


@pytest.mark.training
def test_overfits_a_single_trajectory_and_extrapolates_it():
    """One damped oscillation: the loss must fall to near zero (≪ the signal's variance)."""
    torch.manual_seed(0)
    t = torch.linspace(0.1, 10.0, 60, dtype=torch.float64)
    x = (torch.exp(-0.1 * t) * torch.cos(1.5 * t)).reshape(1, -1, 1)
    model = NeuralLaplace(1).double()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    steps = 700
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)  # settle, no Adam spikes
    obs_t, obs_x, query_t, target = t[:30], x[:, :30], t[30:], x[:, 30:]
    for _ in range(steps):
        opt.zero_grad()
        loss = model.training_loss(obs_t, obs_x, query_t, target)
        loss.backward()
        opt.step()
        schedule.step()
    assert loss.item() < 1e-3 * target.var().item(), loss.item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    torch.manual_seed(0)
    model = NeuralLaplace(2).double()
    obs_t, obs_x, query_t = _data()
    cpu = model(obs_t, obs_x, query_t)
    gpu_model = model.cuda()
    gpu = gpu_model(obs_t.cuda(), obs_x.cuda(), query_t.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-10, atol=1e-10)
    gpu.sum().backward()
