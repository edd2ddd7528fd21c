"""Laplace-Net and the Laplace Neural Operator on problems with a known answer: a damped linear
oscillator's transfer function and initial-condition polynomial, and a pole–residue system's
exact response to a sampled cosine; their gradients, sizes and input checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

from nlmodels import build_model
from nlmodels.ilt import get_ilt
from nlmodels.laplace_net import LaplaceNet
from nlmodels.lno import LNO, PoleResidue, dft

#: x'' + A x' + B x = 0: H(s) = 1/(s² + A s + B), P(s) = x(0) s + A x(0) + x'(0)
A, B = 0.4, 4.0


def oscillator(x0: float, v0: float, t: torch.Tensor) -> torch.Tensor:
    """The closed-form solution of x'' + A x' + B x = 0 from x(0) = x0, x'(0) = v0."""
    w = math.sqrt(B - A * A / 4)
    return torch.exp(-A * t / 2) * (
        x0 * torch.cos(w * t) + (v0 + A * x0 / 2) / w * torch.sin(w * t)
    )


class OscillatorTransfer(nn.Module):
    """The oscillator's H(s), in the shape of Laplace-Net's transfer network (D = 1)."""

    def forward(self, s: torch.Tensor, h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return (1.0 / (s * s + A * s + B))[..., None, None]


@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_laplace_net_with_the_oscillators_transfer_function_predicts_its_solution(shift):
    """Y(s) = H(s) P(s) inverted through the project's ILT (Euler, accurate to ~1e-8 here) is the
    closed-form solution, ``shift`` after the state that P encodes."""
    model = LaplaceNet(1, ilt="euler", terms=33, shift=shift).double()
    model.transfer = OscillatorTransfer()
    x0, v0 = 0.7, -1.3
    with torch.no_grad():  # P's coefficients, ascending powers of s, for every trajectory
        model.initial.head.weight.zero_()
        model.initial.head.bias.copy_(torch.tensor([A * x0 + v0, x0]))
    obs_t = torch.linspace(0.0, 1.0, 11, dtype=torch.float64)
    query_t = torch.linspace(1.05, 6.0, 40, dtype=torch.float64)
    pred = model(obs_t, torch.randn(3, 11, 1, dtype=torch.float64), query_t)
    expected = oscillator(x0, v0, query_t - 1.0 + shift)
    assert pred.shape == (3, 40, 1)
    torch.testing.assert_close(pred[..., 0], expected.expand(3, -1), rtol=0, atol=1e-7)
    # the default ILT (Fourier series, 33 terms) gets within its own discretisation error
    model.ilt = get_ilt("fourier", terms=33)
    with torch.no_grad():
        error = (
            model(obs_t, torch.zeros(1, 11, 1, dtype=torch.float64), query_t)[0, :, 0] - expected
        )
    assert 1e-4 < float(error.abs().max()) < 3e-2


def cosine_response(mu: torch.Tensor, beta: torch.Tensor, w: float, t: torch.Tensor):
    """Re Σ_n β_n ∫_0^t e^{μ_n (t−τ)} cos(wτ) dτ, the response of H(s) = Σ β_n/(s − μ_n) from
    rest to cos(wt), in closed form."""
    mu, beta, t = mu[:, None], beta[:, None], t.to(torch.complex128)
    ew, emu = torch.exp(1j * w * t), torch.exp(mu * t)
    conv = 0.5 * ((ew - emu) / (1j * w - mu) + (1 / ew - emu) / (-1j * w - mu))
    return (beta * conv).sum(0).real


POLES = {
    "real": ([-0.5, -2.0], [1.0, -0.3]),
    "complex": ([-0.3 + 1.7j, -1.0 - 0.4j], [0.8 - 0.5j, 0.2 + 1.1j]),
}


@pytest.mark.parametrize("kind", sorted(POLES))
@pytest.mark.parametrize("per_sample", [False, True])
def test_lno_laplace_layer_is_the_exact_response_of_its_pole_residue_system(kind, per_sample):
    """A cosine sampled at 3 periods on N points is its own trigonometric interpolant, so the
    layer's steady-state + transient sums are the exact response at any later time."""
    layer = PoleResidue(width=1, modes=2).double()
    mu = torch.tensor(POLES[kind][0], dtype=torch.complex128)
    beta = torch.tensor(POLES[kind][1], dtype=torch.complex128)
    with torch.no_grad():
        layer.poles.copy_(torch.view_as_real(mu).view(1, 1, 2, 2))
        layer.residues.copy_(torch.view_as_real(beta).view(1, 1, 2, 2))
    n, dt = 32, 0.1
    w = 2 * math.pi * 3 / (n * dt)
    grid = torch.arange(n, dtype=torch.float64) * dt
    u = torch.cos(w * grid).view(1, 1, n).expand(2, 1, n)
    t = torch.linspace(0.05, 3 * n * dt, 57, dtype=torch.float64)  # far past the input window
    if per_sample:  # each trajectory its own grid (here equal): the per-sample branch
        out = layer(u, torch.full((2,), dt, dtype=torch.float64), t.expand(2, -1))
    else:
        out = layer(u, torch.tensor([dt], dtype=torch.float64), t.unsqueeze(0))
    expected = cosine_response(mu, beta, w, t)
    torch.testing.assert_close(out[:, 0], expected.expand(2, -1), rtol=0, atol=1e-10)
    if kind == "real":  # H(s) U(s) through the project's ILT: the same time function (the
        # Euler ILT is accurate to 1e-6 on this oscillation over the input's window)
        def transform(s: torch.Tensor) -> torch.Tensor:
            return sum(b / (s - m) for m, b in zip(mu, beta)) * s / (s * s + w * w)

        early = t <= n * dt
        inverted = get_ilt("euler", terms=33).invert(transform, t[early])
        torch.testing.assert_close(inverted, expected[early], rtol=0, atol=1e-6)


@pytest.mark.parametrize("n", [1, 7, 32, 101])
def test_lno_dft_is_the_fourier_transform(n):
    """The DFT matrix's products against an FFT (an independent algorithm), even and odd N."""
    u = torch.randn(3, 2, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    torch.testing.assert_close(dft(u), torch.fft.fft(u, dim=-1), rtol=0, atol=1e-12 * n)


def test_lno_per_sample_grids_give_the_shared_grids_answer():
    """Equal rows of ``[B, T]`` times are the one grid they repeat, bit for bit (its terms
    computed once); rows of their own (one trajectory on a grid of twice the step) are each
    answered on its own grid, to rounding."""
    torch.manual_seed(0)
    model = LNO(2, width=3, modes=2, hidden=8).double()
    t = torch.linspace(0.1, 4.0, 20, dtype=torch.float64)
    x = torch.randn(4, 10, 2, dtype=torch.float64)
    shared = model(t[:10], x, t[10:])
    assert torch.equal(model(t[:10].expand(4, -1), x, t[10:].expand(4, -1)), shared)
    obs, query = t[:10].repeat(4, 1), t[10:].repeat(4, 1)
    obs[1], query[1] = 2 * obs[1], 2 * query[1]
    mixed = model(obs, x, query)
    alone = model(2 * t[:10], x[1:2], 2 * t[10:])[0]
    torch.testing.assert_close(mixed[1], alone, rtol=1e-12, atol=1e-12)
    others = [0, 2, 3]
    torch.testing.assert_close(mixed[others], shared[others], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(mixed[1], shared[1])


TINY = {
    "laplace_net": dict(
        encoder_units=3, encoder_layers=1, transfer_units=4, transfer_layers=1, terms=5
    ),
    "lno": dict(width=2, modes=2, hidden=3),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_gradcheck_in_float64(name):
    torch.manual_seed(0)
    model = build_model(name, 2, **TINY[name]).double()
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    obs_t = torch.linspace(0.1, 1.0, 5, dtype=torch.float64)
    query_t = torch.linspace(1.2, 2.0, 3, dtype=torch.float64)
    obs_x = torch.randn(2, 5, 2, dtype=torch.float64, requires_grad=True)

    def f(x, *p):
        return functional_call(model, dict(zip(names, p)), (obs_t, x, query_t))

    assert torch.autograd.gradcheck(f, (obs_x, *params), eps=1e-6, atol=1e-6, fast_mode=True)


@pytest.mark.parametrize(("name", "count"), [("laplace_net", 18_216), ("lno", 17_969)])
def test_sizes_are_near_the_baselines_budget(name, count):
    n = sum(p.numel() for p in build_model(name, 1).parameters())
    assert n == count and 17_000 <= n <= 18_500


def test_inputs_the_models_cannot_use_are_refused_by_name():
    t = torch.linspace(0.1, 2.0, 10)
    x = torch.zeros(2, 5, 1)
    with pytest.raises(ValueError, match="exceed the last observed time"):
        build_model("laplace_net", 1)(t[:5], x, t[4:])
    with pytest.raises(ValueError, match="linear ILT"):
        build_model("laplace_net", 1, ilt="dehoog")
    uneven = torch.tensor([0.1, 0.2, 0.4, 0.5, 0.6])
    with pytest.raises(ValueError, match="uniform observation grid"):
        build_model("lno", 1)(uneven, x, t[5:])
    with pytest.raises(ValueError, match="at least two observations"):
        build_model("lno", 1)(t[:1], x[:, :1], t[5:])
    with pytest.raises(ValueError, match="modes must be"):
        build_model("lno", 1, modes=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", sorted(TINY))
def test_cuda_gives_the_cpus_forecast_in_float64(name):
    torch.manual_seed(0)
    model = build_model(name, 2, **TINY[name]).double()
    t = torch.linspace(0.1, 2.0, 12, dtype=torch.float64)
    x = torch.randn(3, 6, 2, dtype=torch.float64)
    expected = model(t[:6], x, t[6:])
    got = model.cuda()(t[:6].cuda(), x.cuda(), t[6:].cuda())
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-9, atol=1e-10)
