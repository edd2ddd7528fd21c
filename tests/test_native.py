"""The fused C kernels (nlmodels.accel.native): their maths against torch/mpmath, the GRU and
decoder against their pure-torch twins, the checks of every call, and the build, trust and fallback
rules."""

import platform
import shutil
import warnings

import mpmath
import pytest
import torch

import nlmodels.accel.decoder as decoder_module
from nlmodels import NeuralLaplace
from nlmodels.accel import native as _native
from nlmodels.accel.gru import _NativeGRU, _WavefrontGRU, gru_final_output
from nlmodels.accel.native import _store

HAS_TOOLCHAIN = (
    platform.system() == "Linux"
    and platform.machine() == "x86_64"
    and shutil.which("cc") is not None
)
needs_native = pytest.mark.skipif(not HAS_TOOLCHAIN, reason="native kernels need Linux x86-64 + cc")


def _cpu_has(*flags: str) -> bool:
    return set(flags) <= set(_store.cpu_features().split())


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
    """An empty kernel cache (and default cache) and no loaded library; restored afterwards."""
    monkeypatch.setenv("NLLAB_NATIVE_CACHE", str(tmp_path / "native-cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    _native._forget()
    yield tmp_path / "native-cache"
    _native._forget()


@pytest.fixture
def quick_build(fresh_native, monkeypatch):
    """``fresh_native`` with the kernels built at -O0 (seconds faster on a loaded machine): for
    the tests of the build, cache and trust rules, which do not depend on the optimisation."""
    monkeypatch.setattr(_store, "_FLAGS", ("-O0", *_store._FLAGS[1:]))
    return fresh_native


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
@pytest.mark.parametrize("op", range(5))
def test_vector_maths_gives_each_element_the_same_bits_on_every_path(op, build):
    """The maths takes several vectors at once, then single vectors, then a partial one: an
    element's bits must not depend on which of them computed it (each alone is the partial path)."""
    torch.manual_seed(op)
    x = torch.empty(16 * 3 + 4 + 3, dtype=torch.float64).uniform_(-30.0, 30.0)
    together = _math(op, x)
    alone = torch.cat([_math(op, x[i : i + 1]) for i in range(x.numel())])
    assert together.numpy().tobytes() == alone.numpy().tobytes()


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
    monkeypatch.setattr(decoder_module, "_CHUNK_ELEMENTS", 3000)
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
@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize(("state_dim", "n_query", "terms"), [(2, 100, 33), (1, 9, 7), (3, 13, 3)])
def test_the_sliced_decoder_gives_the_chunk_steps_bits_whatever_the_slice(
    monkeypatch, per_sample, state_dim, n_query, terms
):
    """Under the portable products, one kernel call per chunk that takes it slice by slice
    (nl_decoder_forward/backward) against the chunk's steps one by one (kernels and torch
    products): the prediction and every gradient bit for bit, for slices of one row's worth up to
    the whole chunk, several chunks and a partial last chunk and slice."""
    from nlmodels.accel import portable

    if not portable.installed():
        pytest.skip("the sliced kernels are the portable mode's")
    monkeypatch.setenv("NLLAB_NATIVE", "1")
    monkeypatch.setattr(decoder_module, "_CHUNK_ELEMENTS", 2 * n_query * state_dim * terms * 9)
    torch.manual_seed(n_query)
    model = NeuralLaplace(state_dim, terms=terms).double()
    batch, obs_t = 23, torch.linspace(0.1, 3.0, 12, dtype=torch.float64)
    obs_x = torch.randn(batch, 12, state_dim, dtype=torch.float64)
    if per_sample:
        query_t = 3.0 + torch.rand(batch, n_query, dtype=torch.float64).sort(-1).values * 4
    else:
        query_t = torch.linspace(3.1, 8.0, n_query, dtype=torch.float64)
    calls, call = [], _native.call
    monkeypatch.setattr(decoder_module.native, "call", lambda *a: calls.append(a[0]) or call(*a))
    with monkeypatch.context() as steps:
        steps.setattr(decoder_module, "portable", type("Off", (), {"installed": lambda: False}))
        y_steps, g_steps = _run_model(model, obs_t, obs_x, query_t)
    assert "nl_decoder_forward" not in calls
    for rows in (1, 2 * n_query + 1, 8 * n_query, 10**6):
        monkeypatch.setattr(decoder_module, "_SLICE_ROWS", rows)
        calls.clear()
        y, g = _run_model(model, obs_t, obs_x, query_t)
        assert calls.count("nl_decoder_forward") == calls.count("nl_decoder_backward") > 1
        assert torch.equal(y, y_steps)
        for got, want in zip(g, g_steps, strict=True):
            assert torch.equal(got, want)


@needs_native
def test_a_slice_the_lanes_cannot_take_is_refused():
    # 3 trajectories of 7 times: 21 rows, not a whole number of vectors of output-bias sums
    args = _sliced_decoder_args(n=5, n_time=7, slice=3)
    assert _native.call("nl_decoder_forward", *args) == 2
    assert _native.call("nl_decoder_forward", *_sliced_decoder_args(n=5, n_time=7, slice=8)) == 0
    for n_time in range(1, 1200, 7):  # what the decoder picks: whole vectors, about 512 rows
        slice = decoder_module.slice_trajectories(n_time, 512)
        assert slice >= 1 and slice * n_time % 8 == 0
        assert slice * n_time <= 512 or slice * n_time <= 8 * n_time


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
def test_build_is_cached_and_reused_without_a_compiler(quick_build, monkeypatch):
    assert _native.kernels() is not None
    builds = list(quick_build.glob("nlkernels-*.so"))
    assert len(builds) == 1
    files = sorted(quick_build.iterdir())  # the library, its build record and its lock file
    assert [p.suffix for p in files] == [".json", ".lock", ".so"]
    _native._forget()
    monkeypatch.setenv("CC", "no-such-compiler-here")  # a cached build needs no compiler
    assert _native.kernels() is not None
    assert sorted(quick_build.iterdir()) == files  # nothing new, no temporary left


def test_failed_build_warns_once_and_falls_back_to_torch(fresh_native, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setenv("NLLAB_NATIVE", "auto")
    with pytest.warns(RuntimeWarning, match="native CPU kernels unavailable") as caught:
        assert _native.kernels() is None
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message and "not bitwise" in message
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


@pytest.mark.heavy  # compiles the kernels in racing processes
@needs_native
def test_concurrent_first_builds_are_safe(tmp_path):
    # the quick profile's worker processes may all find the cache empty at once
    import os
    import subprocess
    import sys

    cache = tmp_path / "shared-cache"
    env = {**os.environ, "NLLAB_NATIVE_CACHE": str(cache), "NLLAB_NATIVE": "1"}
    code = "from nlmodels.accel import native; assert native.kernels() is not None"
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


# ---- every call is checked before C sees it ---------------------------------------------------


def _f64(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float64)


def _gru_forward_args(n_time=4, batch=3, n_inputs=2, units=5, n_layers=2):
    w_ih = _f64(3 * units * (n_inputs + (n_layers - 1) * units))
    return [
        n_time, batch, n_inputs, units, n_layers, _f64(n_inputs, n_time, batch), w_ih,
        _f64(n_layers, 3 * units, units), _f64(n_layers, 3 * units), _f64(n_layers, 3 * units),
        _f64(n_layers, units, n_time + 1, batch), _f64(n_layers, 4 * units, n_time, batch),
    ]  # fmt: skip


def _decoder_forward_args(n=2, n_time=7, dims=2, n_query=3, per_row=0):
    rows_w = n if per_row else 1
    return [
        n, n_time, dims, n_query, per_row, _f64(2 * dims * n_query, n * n_time),
        _f64(2 * dims * n_query), _f64(rows_w, n_query, n_time), _f64(rows_w, n_query, n_time),
        0.5, 0.1, _f64(n, n_time, dims), _f64(n_time),
    ]  # fmt: skip


def _sliced_decoder_args(n=2, n_time=7, units=5, dims=2, n_query=3, slice=8, per_row=0):
    outputs, rows, per = 2 * dims * n_query, n * n_time, n if per_row else 1
    return [
        n, n_time, units, dims, n_query, slice, per_row, _f64(per, n_time, units), _f64(n, units),
        _f64(units, units), _f64(units), _f64(outputs, units), _f64(outputs), per_row,
        _f64(per, n_query, n_time), _f64(per, n_query, n_time), 0.5, 0.1, _f64(rows, units),
        _f64(rows, units), _f64(rows * outputs), _f64(n, n_time, dims), _f64(n_time),
    ]  # fmt: skip


def _sliced_decoder_backward_args(n=2, n_time=7, units=5, dims=2, n_query=3, per_row=1):
    outputs, rows, per = 2 * dims * n_query, n * n_time, n if per_row else 1
    return [
        n, n_time, units, dims, n_query, 8, per_row, _f64(units, units), _f64(outputs, units),
        _f64(rows, units), _f64(rows, units), _f64(rows * outputs), _f64(n, n_time, dims),
        _f64(per, n_time, units), _f64(n, units), _f64(units, units), _f64(units),
        _f64(outputs, units), _f64(outputs),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "args"),
    [("nl_gru_forward", _gru_forward_args()), ("nl_sphere_out_forward", _decoder_forward_args()),
     ("nl_sphere_out_forward", _decoder_forward_args(per_row=1)),
     ("nl_decoder_forward", _sliced_decoder_args(per_row=1)),
     ("nl_decoder_backward", _sliced_decoder_backward_args())],
)  # fmt: skip
def test_a_tensor_of_the_wrong_size_raises_before_the_call(name, args):
    _native._checked(name, tuple(args))  # the right sizes pass the check
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            grown = _f64(arg.shape[0] + 1, *arg.shape[1:])  # one row too many
            shrunk = arg.reshape(-1)[:-1] if arg.numel() > 1 else _f64(0)  # one element short
            for wrong in (grown, shrunk):
                bad = [*args[:i], wrong, *args[i + 1 :]]
                with pytest.raises(ValueError, match=rf"{name}: \w+ has shape"):
                    _native.call(name, *bad)


def test_swapped_arguments_raise():
    args = _gru_forward_args(n_time=4, batch=3)
    swapped_sizes = [args[1], args[0], *args[2:]]  # batch and n_time exchanged
    with pytest.raises(ValueError, match="x has shape"):
        _native.call("nl_gru_forward", *swapped_sizes)
    swapped_tensors = [*args[:5], args[6], args[5], *args[7:]]  # x and w_ih exchanged
    with pytest.raises(ValueError, match="x has shape"):
        _native.call("nl_gru_forward", *swapped_tensors)
    h, bias = _f64(4, 6), _f64(6)
    with pytest.raises(ValueError, match="h has shape"):
        _native.call("nl_bias_tanh", 4, 6, bias, h)
    with pytest.raises(ValueError, match="h has shape"):
        _native.call("nl_bias_tanh", 6, 4, h, bias)


def test_bad_scalar_arguments_and_counts_raise():
    args = _decoder_forward_args()
    with pytest.raises(ValueError, match="takes 13 arguments"):
        _native.call("nl_sphere_out_forward", *args[:-1])
    with pytest.raises(ValueError, match=r"per_row must be one of \(0, 1\)"):
        _native.call("nl_sphere_out_forward", *args[:4], 2, *args[5:])
    with pytest.raises(ValueError, match="n must be an integer >= 0"):
        _native.call("nl_sphere_out_forward", -2, *args[1:])
    with pytest.raises(ValueError, match="op must be one of"):
        _native.call("nl_vector_math", 9, 2, _f64(2), _f64(2))
    with pytest.raises(ValueError, match="unknown native kernel 'nl_nope'; valid: nl_bias_tanh"):
        _native.call("nl_nope")
    with pytest.raises(ValueError, match="y must be a tensor"):
        _native.call("nl_vector_math", 0, 2, _f64(2), [0.0, 0.0])


# ---- the cache is trusted before anything in it is loaded ------------------------------------

_PLANTED_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(getenv("NLLAB_TEST_MARKER"), "w");
    if (f) { fputs("constructor ran", f); fclose(f); }
}
void nl_vector_math(int op, long n, const double *x, double *y) {}
"""


def _plant(path, tmp_path, monkeypatch):
    """A library at ``path`` whose constructor writes a marker file when it is loaded."""
    import subprocess

    source = tmp_path / "planted.c"
    source.write_text(_PLANTED_C)
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(path)], check=True)
    marker = tmp_path / "constructor-ran"
    monkeypatch.setenv("NLLAB_TEST_MARKER", str(marker))
    return marker


@needs_native
def test_a_library_planted_in_a_world_writable_cache_is_never_loaded(quick_build, monkeypatch):
    import hashlib
    import json

    quick_build.mkdir(mode=0o700)
    quick_build.chmod(0o777)  # anyone can write here
    planted = _store.target(quick_build)
    marker = _plant(planted, quick_build.parent, monkeypatch)
    # even with a build record that matches it: the directory alone disqualifies the cache
    digest = hashlib.sha256(planted.read_bytes()).hexdigest()
    planted.with_suffix(".json").write_text(json.dumps({"sha256": digest, "self_test": "passed"}))
    before = planted.read_bytes()
    refused = r"native-cache is writable by other users \(mode 777\)"
    with pytest.warns(RuntimeWarning, match=refused):
        assert _native.kernels() is not None  # built in the safe default directory instead
    assert not marker.exists()
    assert planted.read_bytes() == before  # the refused directory is left as it was
    assert list((quick_build.parent / "xdg-cache" / "nllab" / "native").glob("nlkernels-*.so"))


@needs_native
def test_a_library_without_a_build_record_is_rebuilt_not_loaded(quick_build, monkeypatch):
    quick_build.mkdir(mode=0o700)
    planted = _store.target(quick_build)
    marker = _plant(planted, quick_build.parent, monkeypatch)
    with pytest.warns(RuntimeWarning, match="has no build record"):
        assert _native.kernels() is not None
    assert not marker.exists()
    assert _store.verification_problem(planted) is None  # the rebuilt library, recorded


@needs_native
def test_a_corrupted_library_is_detected_by_its_hash_and_rebuilt(quick_build):
    quick_build.mkdir(mode=0o700)
    library = _store.target(quick_build)
    _store.build(library)
    good = library.read_bytes()
    corrupted = bytearray(good)
    corrupted[len(good) // 2 : len(good) // 2 + 16] = b"\xff" * 16
    library.write_bytes(bytes(corrupted))
    assert "SHA-256" in _store.verification_problem(library)
    with pytest.warns(RuntimeWarning, match="do not match the SHA-256 recorded at its build"):
        assert _native.kernels() is not None
    assert library.read_bytes() != bytes(corrupted)
    assert _store.verification_problem(library) is None
    torch.testing.assert_close(_math(2, torch.tensor([0.5], dtype=torch.float64)),
                               torch.tanh(torch.tensor([0.5], dtype=torch.float64)))  # fmt: skip


@needs_native
def test_a_self_test_that_kills_its_child_falls_back_with_a_warning(
    quick_build, monkeypatch, tmp_path
):
    crash = tmp_path / "crash.py"
    crash.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    monkeypatch.setattr(_store, "SELF_TEST_SCRIPT", crash)
    builds = []
    build = _store.build
    monkeypatch.setattr(_store, "build", lambda path: (builds.append(path), build(path)))
    monkeypatch.setenv("NLLAB_NATIVE", "auto")
    with pytest.warns(RuntimeWarning, match="killed by SIGILL"):
        assert _native.kernels() is None  # this process survived and keeps the torch path
    assert len(builds) == 1  # a new build failing is not rebuilt
    library = _store.target(quick_build)
    assert _store._read_record(library)["self_test"] == "pending"  # never marked as passed
    # an older build whose self-test fails is rebuilt once, then given up on
    _native._forget()
    monkeypatch.setenv("NLLAB_NATIVE", "1")
    with pytest.raises(_native.NativeUnavailable, match="killed by SIGILL"):
        _native.kernels()
    assert len(builds) == 2


@needs_native
def test_a_cache_owned_by_another_user_is_refused(quick_build, monkeypatch):
    import os
    import tempfile

    quick_build.mkdir(mode=0o700)
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 4321)  # as if someone else made them
    monkeypatch.setattr(_store, "_private_dir", None)
    monkeypatch.setattr(tempfile, "tempdir", str(quick_build.parent))  # the private dir's parent
    with pytest.warns(RuntimeWarning, match=rf"owned by user id {real_uid}, not by you"):
        assert _native.kernels() is not None
    assert not list(quick_build.iterdir())  # nothing built or loaded there
    assert _store._private_dir is not None and list(_store._private_dir.glob("nlkernels-*.so"))


def test_the_private_cache_is_removed_when_the_process_that_made_it_exits(tmp_path, monkeypatch):
    """The fallback cache of a process whose every cache folder is refused is its own
    temporary folder: removed at its exit, and not by a forked child's."""
    import atexit
    import os
    import tempfile

    refused = tmp_path / "a-file"
    refused.write_text("")
    monkeypatch.setenv("NLLAB_NATIVE_CACHE", str(refused))
    monkeypatch.setattr(_store, "_default_dir", lambda: refused)
    monkeypatch.setattr(_store, "_home_dir", lambda: refused)
    monkeypatch.setattr(_store, "_private_dir", None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    at_exit = []
    monkeypatch.setattr(atexit, "register", lambda f, *args: at_exit.append((f, args)))
    with pytest.warns(RuntimeWarning, match="not a directory"):
        private = _store.cache_dir()
    with pytest.warns(RuntimeWarning):
        assert _store.cache_dir() == private  # one per process, registered once
    assert private.parent == tmp_path and private.is_dir()
    ((remove, (folder, maker)),) = at_exit
    (private / "nlkernels-0.so").write_bytes(b"")
    remove(folder, maker + 1)  # a forked child exiting
    assert private.is_dir()
    remove(folder, os.getpid())
    assert not private.exists()


def test_a_build_that_times_out_is_retried_with_a_longer_limit():
    """A compiler slowed down by load: the first limit passes, the retry's longer one does not;
    past the last limit the timeout is raised (and the kernels fall back)."""
    import subprocess
    import sys

    slow = [sys.executable, "-c", "import time; time.sleep(1.0)"]
    assert _store._patiently(slow, (0.2, 20.0)).returncode == 0
    with pytest.raises(subprocess.TimeoutExpired):
        _store._patiently(slow, (0.1, 0.2))
    assert _store.BUILD_TIMEOUTS[1] > _store.BUILD_TIMEOUTS[0]


def _lane_wise_cases(g: torch.Generator) -> dict[str, tuple[list, tuple[int, ...]]]:
    """Each lane-wise kernel's C arguments (sizes off the vectors' widths, so the masked tails
    run) and which of them it writes."""

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    def z(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.float64)

    n_time, batch, n_in, units, layers = 13, 21, 3, 11, 2
    w_ih = r(3 * units * (n_in + (layers - 1) * units), scale=0.5)
    gru = [n_time, batch, n_in, units, layers, r(n_in, n_time, batch), w_ih]
    gru += [r(layers, 3 * units, units, scale=0.5), r(layers, 3 * units), r(layers, 3 * units)]
    gru += [
        z(layers, units, n_time + 1, batch),
        z(layers, 4 * units, n_time, batch),
    ]
    n, dims, q = 3, 2, 5
    sphere = [n, n_time, dims, q, 0, r(2 * dims * q, n * n_time, scale=2.0), r(2 * dims * q)]
    sphere += [r(q, n_time).abs(), r(q, n_time, scale=3.0), 1.3]
    sphere += [0.1, z(n, n_time, dims), z(n_time)]
    gru_back = [*gru[:7], gru[7], r(layers, units, n_time + 1, batch)]
    gru_back += [r(layers, 4 * units, n_time, batch).sigmoid(), r(units, batch), z(w_ih.numel())]
    gru_back += [z(layers, 3 * units, units), z(layers, 3 * units), z(layers, 3 * units)]
    gru_back += [z(n_in, n_time, batch)]
    tanh_back = [n * n_time, units, r(n * n_time, units), r(n * n_time, units).tanh(), r(units)]
    return {
        "nl_gru_forward": (gru, (10, 11)),
        "nl_gru_backward": (gru_back, (11, 12, 13, 14, 15)),
        "nl_first_hidden": (
            [
                n,
                n_time,
                units,
                1,
                r(n, n_time, units, scale=3.0),
                r(n, units),
                z(n * n_time, units),
            ],
            (6,),
        ),
        "nl_bias_tanh": ([n * n_time, units, r(n * n_time, units, scale=3.0), r(units)], (2,)),
        "nl_sphere_out_forward": (sphere, (5, 11)),
        # the backward steps' column sums: one column per lane, accumulated onto nonzero values
        "nl_tanh_backward": (tanh_back, (2, 4)),
        "nl_first_hidden_backward": (
            [n, n_time, units, 0, *tanh_back[2:4], r(1, n_time, units), r(n, units)],
            (4, 6, 7),
        ),
    }


def _run_lane_wise(library, name: str, width: str, args: list) -> list:
    """Kernel ``name`` of one vector width (``w4``, ``w8``, or "" the entry point) on a copy of
    ``args`` (tensors by their data, with the entry point's C signature); the copy."""
    function = getattr(library, f"{name}_{width}" if width else name)
    function.argtypes = getattr(library, name).argtypes
    copied = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    function(*(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in copied))
    return copied


@needs_native
@pytest.mark.skipif(not _cpu_has("avx512f"), reason="the 512-bit code needs AVX-512F")
def test_the_portable_builds_512_bit_lane_wise_kernels_give_its_256_bit_bits():
    """The portable build compiles its lane-wise kernels for 256- and 512-bit vectors and runs
    the latter where the CPU has them: the same operations lane by lane (the GRU backward's sums
    along rows in 4 lanes in both), so every output bit is the 256-bit code's (the code every
    other x86-64-v3 CPU runs)."""
    library = _native.library()
    if library is None or not hasattr(library, "nl_bias_tanh_w8"):
        pytest.skip("this build has one vector width (not the portable build)")
    g = torch.Generator().manual_seed(8)
    for name, (args, written) in _lane_wise_cases(g).items():
        runs = {width: _run_lane_wise(library, name, width, args) for width in ("w4", "w8", "")}
        for i in written:
            assert torch.isfinite(runs["w4"][i]).all(), (name, i)
            assert torch.equal(runs["w8"][i], runs["w4"][i]), (name, i)
            assert torch.equal(runs[""][i], runs["w4"][i]), (name, i)
