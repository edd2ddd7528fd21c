"""The fused C kernels (nlmodels._native): their maths against torch/mpmath, the GRU and decoder
against their pure-torch twins, and the build/fallback rules."""

import platform
import shutil
import warnings

import mpmath
import pytest
import torch

import nlmodels.neural_laplace as nl_module
from nlmodels import NeuralLaplace, _native
from nlmodels._gru import _WavefrontGRU, gru_final_output

HAS_TOOLCHAIN = (
    platform.system() == "Linux"
    and platform.machine() == "x86_64"
    and shutil.which("cc") is not None
)
needs_native = pytest.mark.skipif(not HAS_TOOLCHAIN, reason="native kernels need Linux x86-64 + cc")


def _cpu_has(*flags: str) -> bool:
    return set(flags) <= set(_native._cpu_features().split())


@pytest.fixture(
    params=[
        "native",
        pytest.param(
            "haswell",
            marks=pytest.mark.skipif(not _cpu_has("avx2", "fma"), reason="needs AVX2 + FMA"),
        ),
    ]
)
def build(request, monkeypatch):
    """Each kernel test runs on the build for this CPU (AVX-512 here) and on the AVX2 + FMA one."""
    monkeypatch.setenv("NLLAB_NATIVE_MARCH", request.param)
    _native._forget()
    yield request.param
    monkeypatch.delenv("NLLAB_NATIVE_MARCH")
    _native._forget()


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """An empty kernel cache and no loaded library; restored afterwards."""
    monkeypatch.setenv("NLLAB_NATIVE_CACHE", str(tmp_path / "native-cache"))
    _native._forget()
    yield tmp_path / "native-cache"
    _native._forget()


def _math(op: int, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _native.call("nl_vector_math", op, x.numel(), x, y)
    return y


@needs_native
def test_the_kernels_build_and_load_on_this_platform(monkeypatch):
    # CI runs on Linux x86-64 with a C compiler: the fast path must really be in use there.
    monkeypatch.setenv("NLLAB_NATIVE", "1")
    assert _native.native_enabled()


@needs_native
@pytest.mark.parametrize(
    ("op", "reference", "low", "high"),
    [(0, torch.exp, -700.0, 700.0), (1, torch.sigmoid, -700.0, 700.0), (2, torch.tanh, -40.0, 40.0),
     (3, torch.sin, -60.0, 60.0), (4, torch.cos, -60.0, 60.0)],
)  # fmt: skip
def test_vector_maths_is_accurate_to_a_few_ulp(op, reference, low, high, build):
    torch.manual_seed(op)
    x = torch.empty(100_003, dtype=torch.float64).uniform_(low, high)  # odd: a partial vector
    got, expected = _math(op, x), reference(x)
    if op < 3:  # exp, sigmoid, tanh: relative error
        assert ((got - expected).abs() / expected.abs()).max() < 1.5e-15
    else:  # sin, cos: absolute error (relative is meaningless at their zeros)
        assert (got - expected).abs().max() < 5e-16


@needs_native
def test_vector_maths_against_mpmath_near_zero_and_at_the_extremes(build):
    points = [1e-300, 1e-20, 1e-8, -3e-5, 0.25, -2.5, 17.0, -350.0]
    x = torch.tensor(points, dtype=torch.float64)
    mpmath.mp.dps = 40
    tanh = _math(2, x)
    for value, got in zip(points, tanh.tolist()):
        exact = float(mpmath.tanh(mpmath.mpf(value)))
        assert got == pytest.approx(exact, rel=4e-16, abs=0.0)
    sig = _math(1, x)
    for value, got in zip(points, sig.tolist()):
        exact = float(1 / (1 + mpmath.exp(-mpmath.mpf(value))))
        assert got == pytest.approx(exact, rel=4e-16, abs=1e-300)


@needs_native
def test_vector_maths_propagates_nan(build):
    x = torch.tensor([float("nan"), 1.0, float("nan")], dtype=torch.float64)
    for op in range(5):
        y = _math(op, x)
        assert torch.isnan(y[0]) and torch.isnan(y[2]) and torch.isfinite(y[1])


# ---- the GRU encoder -------------------------------------------------------------------------


@needs_native
@pytest.mark.parametrize(
    ("batch", "steps", "inputs", "units", "layers"),
    [(128, 100, 2, 21, 2), (37, 9, 3, 5, 1), (1, 1, 1, 1, 2), (130, 4, 30, 5, 3), (8, 6, 2, 33, 2)],
)
def test_native_gru_equals_nn_gru(batch, steps, inputs, units, layers, build):
    torch.manual_seed(batch + steps)
    gru = torch.nn.GRU(inputs, units, layers, batch_first=True).double()
    x = torch.randn(batch, steps, inputs, dtype=torch.float64, requires_grad=True)
    expected = gru(x)[0][:, -1]
    got = gru_final_output(x, gru)
    assert got.grad_fn is not None and "Native" in type(got.grad_fn).__name__
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    weight = torch.randn_like(expected)
    inputs_ = [x, *gru.parameters()]
    for a, b in zip(
        torch.autograd.grad((got * weight).sum(), inputs_),
        torch.autograd.grad((expected * weight).sum(), inputs_),
    ):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@needs_native
def test_native_gru_gradcheck():
    torch.manual_seed(1)
    gru = torch.nn.GRU(2, 3, 2, batch_first=True).double()
    x = torch.randn(3, 5, 2, dtype=torch.float64, requires_grad=True)
    params = list(gru.parameters())
    from nlmodels._gru import _NativeGRU

    assert torch.autograd.gradcheck(lambda x, *w: _NativeGRU.apply(x, 2, *w), (x, *params))


def test_torch_path_is_the_same_gru(monkeypatch):
    monkeypatch.setenv("NLLAB_NATIVE", "0")
    torch.manual_seed(2)
    gru = torch.nn.GRU(2, 4, 2, batch_first=True).double()
    x = torch.randn(5, 7, 2, dtype=torch.float64, requires_grad=True)
    got = gru_final_output(x, gru)
    assert isinstance(got.grad_fn, _WavefrontGRU._backward_cls)
    torch.testing.assert_close(got, gru(x)[0][:, -1], rtol=0, atol=1e-14)


# ---- the decoder -----------------------------------------------------------------------------


def _run_model(model, obs_t, obs_x, query_t):
    model.zero_grad()
    y = model(obs_t, obs_x, query_t)
    (y * torch.cos(y)).sum().backward()
    return y.detach(), [p.grad.clone() for p in model.parameters()]


@needs_native
@pytest.mark.parametrize("state_dim", [1, 2, 3])
@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize(("terms", "max_frequency"), [(33, None), (3, None), (17, 20.0)])
def test_native_decoder_equals_torch_decoder(
    monkeypatch, state_dim, per_sample, terms, max_frequency, build
):
    # small chunks: the batch spans several, including a partial last one
    monkeypatch.setattr(nl_module, "_CHUNK_ELEMENTS", 3000)
    torch.manual_seed(state_dim)
    model = NeuralLaplace(state_dim, terms=terms, max_frequency=max_frequency).double()
    batch = 11
    obs_t = torch.linspace(0.1, 3.0, 12, dtype=torch.float64)
    obs_x = torch.randn(batch, 12, state_dim, dtype=torch.float64)
    if per_sample:
        query_t = 3.0 + torch.rand(batch, 9, dtype=torch.float64).sort(-1).values * 4
    else:
        query_t = torch.linspace(3.1, 8.0, 9, dtype=torch.float64)
    monkeypatch.setenv("NLLAB_NATIVE", "1")
    y_native, g_native = _run_model(model, obs_t, obs_x, query_t)
    monkeypatch.setenv("NLLAB_NATIVE", "0")
    y_torch, g_torch = _run_model(model, obs_t, obs_x, query_t)
    torch.testing.assert_close(y_native, y_torch, rtol=1e-12, atol=1e-13)
    for a, b in zip(g_native, g_torch):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@needs_native
def test_native_decoder_gradcheck(monkeypatch):
    monkeypatch.setenv("NLLAB_NATIVE", "1")
    torch.manual_seed(3)
    model = NeuralLaplace(2, laplace_units=6, encoder_units=3, terms=7).double()
    p = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    query_t = torch.tensor([0.5, 1.3, 2.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda p: model.decode(p, query_t), (p,))


# ---- build, cache and fallback ---------------------------------------------------------------


@needs_native
def test_build_is_cached_and_reused_without_a_compiler(fresh_native, monkeypatch):
    assert _native.kernels() is not None
    builds = list(fresh_native.glob("nlkernels-*.so"))
    assert len(builds) == 1
    _native._forget()
    monkeypatch.setenv("CC", "no-such-compiler-here")  # a cached build needs no compiler
    assert _native.kernels() is not None
    assert list(fresh_native.glob("*")) == builds  # nothing new, no temporary left


def test_failed_build_warns_once_and_falls_back_to_torch(fresh_native, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setenv("NLLAB_NATIVE", "auto")
    with pytest.warns(RuntimeWarning, match="native CPU kernels unavailable"):
        assert _native.kernels() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call is silent
        assert _native.kernels() is None
    torch.manual_seed(4)
    model = NeuralLaplace(1).double()
    t = torch.linspace(0.1, 1.0, 5, dtype=torch.float64)
    y = model(t, torch.randn(2, 5, 1, dtype=torch.float64), t + 1)
    assert y.shape == (2, 5, 1) and torch.isfinite(y).all()


def test_required_native_mode_raises_when_the_build_fails(fresh_native, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setenv("NLLAB_NATIVE", "1")
    with pytest.raises(_native.NativeUnavailable, match="no-such-compiler-here"):
        _native.kernels()


def test_native_mode_is_validated(monkeypatch):
    monkeypatch.setenv("NLLAB_NATIVE", "fast")
    with pytest.raises(ValueError, match="NLLAB_NATIVE"):
        _native.kernels()


def test_disabled_mode_keeps_the_torch_path(monkeypatch):
    monkeypatch.setenv("NLLAB_NATIVE", "0")
    assert not _native.native_enabled()
    assert not _native.usable(torch.zeros(2, dtype=torch.float64))


def test_only_float64_cpu_tensors_are_native(monkeypatch):
    assert not _native.usable(torch.zeros(2, dtype=torch.float32))
    with pytest.raises(ValueError, match="contiguous float64"):
        _native.call("nl_tanh_backward", 1, 1, torch.zeros(2)[::2], torch.zeros(1), torch.zeros(1))


@needs_native
def test_concurrent_first_builds_are_safe(tmp_path):
    # the quick profile's worker processes may all find the cache empty at once
    import os
    import subprocess
    import sys

    cache = tmp_path / "shared-cache"
    env = {**os.environ, "NLLAB_NATIVE_CACHE": str(cache), "NLLAB_NATIVE": "1"}
    code = "from nlmodels import _native; assert _native.kernels() is not None"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(3)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    assert len(list(cache.glob("nlkernels-*.so"))) == 1
    assert not [p for p in cache.iterdir() if not p.name.startswith("nlkernels-")]


@pytest.mark.parametrize("mode", ["auto", "0"])
def test_an_empty_batch_gives_an_empty_prediction(monkeypatch, mode):
    monkeypatch.setenv("NLLAB_NATIVE", mode)
    model = NeuralLaplace(2).double()
    t = torch.linspace(0.1, 1.0, 5, dtype=torch.float64)
    y = model(t, torch.zeros(0, 5, 2, dtype=torch.float64), t + 1)
    assert y.shape == (0, 5, 2)
