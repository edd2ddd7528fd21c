"""The portable mode's own CPU kernels (nlmodels.accel.portable): each product and elementary
function is one stated definition, checked against an independent oracle, bit for bit where the
definition is exact (products: exact rational arithmetic rounding once per fused multiply-add)
and within a few units in the last place elsewhere (mpmath); an element's bits depend on its
value only, whatever its position, batch or pack; autograd and vmap reach the kernels."""

from __future__ import annotations

import cmath
import ctypes
import math
import types
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from torch.func import vmap

import nlmodels
from nlmodels.accel import native, portable

pytestmark = pytest.mark.skipif(
    not portable.installed(), reason="the portable kernels are not installed in this process"
)


def _round(x: Fraction) -> float:
    return float(x)  # Fraction → float rounds to nearest, ties to even: one IEEE rounding


def _reference_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The definition: c = a0·b0 rounded, then c = fma(a_l, b_l, c) for l = 1 .. k-1, each
    fused multiply-add rounded once (exact rationals in between)."""
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            if k == 0:
                continue
            acc = _round(Fraction(a[i, 0]) * Fraction(b[0, j]))
            for l in range(1, k):
                acc = _round(Fraction(a[i, l]) * Fraction(b[l, j]) + Fraction(acc))
            out[i, j] = acc
    return out


SHAPES = [
    (1, 1, 1),
    (3, 5, 2),
    (4, 8, 8),
    (9, 7, 13),
    (5, 0, 3),
    (17, 3, 9),
    (8, 16, 2),
    (2, 33, 4),
    # column tails of 1-3 under blocks of every row count (masked lanes never written)
    (6, 5, 31),
    (11, 4, 15),
    (5, 6, 6),
    (7, 3, 3),
]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_products_follow_their_definition_exactly(m, k, n):
    g = torch.Generator().manual_seed(m * 100 + k * 10 + n)
    a = torch.randn(m, k, generator=g, dtype=torch.float64) * 3.0
    b = torch.randn(k, n, generator=g, dtype=torch.float64)
    want = _reference_product(a.numpy(), b.numpy())
    assert np.array_equal((a @ b).numpy(), want)
    # the same bits through every operand layout: transposed views, a batch, a pack of members
    at, bt = a.T.contiguous().T, b.T.contiguous().T
    assert np.array_equal((at @ bt).numpy(), want)
    batch = torch.stack([a, a * 0.5])
    out = torch.bmm(batch, torch.stack([b, b]))
    assert np.array_equal(out[0].numpy(), want)
    assert np.array_equal(out[1].numpy(), _reference_product(0.5 * a.numpy(), b.numpy()))


def test_matrix_vector_dot_and_affine_forms_share_the_definition():
    g = torch.Generator().manual_seed(7)
    a = torch.randn(6, 11, generator=g, dtype=torch.float64)
    v = torch.randn(11, generator=g, dtype=torch.float64)
    bias = torch.randn(6, generator=g, dtype=torch.float64)
    col = _reference_product(a.numpy(), v.numpy()[:, None])[:, 0]
    assert np.array_equal(torch.mv(a, v).numpy(), col)
    assert np.array_equal(torch.addmv(bias, a, v).numpy(), bias.numpy() + col)
    assert torch.dot(v, v).item() == _reference_product(v.numpy()[None], v.numpy()[:, None])[0, 0]
    lin = torch.nn.functional.linear(a, torch.randn(4, 11, generator=g, dtype=torch.float64))
    out = torch.empty(0, dtype=torch.float64)
    assert torch.equal(torch.mm(a, a.T, out=out), a @ a.T) and out.shape == (6, 6)
    assert lin.shape == (6, 4)
    x = bias.clone()
    x.addmv_(a, v, beta=2.0, alpha=0.5)
    assert np.array_equal(x.numpy(), 2.0 * bias.numpy() + 0.5 * col)


def test_float32_and_complex_products():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 9, generator=g, dtype=torch.float64)
    b = torch.randn(9, 4, generator=g, dtype=torch.float64)
    # float32: computed in float64 by the definition, rounded once
    a32, b32 = a.float(), b.float()
    want = _reference_product(a32.double().numpy(), b32.double().numpy()).astype(np.float32)
    assert np.array_equal((a32 @ b32).numpy(), want)
    # complex: four real products
    c, d = torch.complex(a, a.flip(0)), torch.complex(b, -b)
    got = (c @ d).numpy()
    ar, ai, br, bi = (x.numpy() for x in (a, a.flip(0), b, -b))
    real = _reference_product(ar, br) - _reference_product(ai, bi)
    imag = _reference_product(ar, bi) + _reference_product(ai, br)
    assert np.array_equal(got.real, real) and np.array_equal(got.imag, imag)


def test_a_lazily_conjugated_operand_is_read_conjugated():
    """Autograd's backward of a complex product multiplies by conjugate views (``x.conj()``
    sets a bit and keeps the data): the product reads them as the values they stand for."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(3, 6, generator=g, dtype=torch.complex128)
    b = torch.randn(6, 2, generator=g, dtype=torch.complex128)
    for left, right in ((a.conj(), b), (a, b.conj()), (b.T.conj(), a.T.conj())):
        plain = left.resolve_conj() @ right.resolve_conj()
        assert torch.equal(left @ right, plain)
    # and so a complex gradient: d/da of sum(a @ b) is conj-free ones @ b.T, as torch's own
    w = a.clone().requires_grad_(True)
    (w @ b).real.sum().backward()
    want = torch.ones(3, 2, dtype=torch.complex128) @ b.resolve_conj().T.conj().resolve_conj()
    assert torch.equal(w.grad, want)


def _batched_cases(count: int = 40, seed: int = 5):
    """Random (members, m, k, n, transposed): matrix–vector shapes (m or n = 1) one time in
    three each, inner sizes across the kernel's blocks and tails, and the right operand a
    transposed view (as a packed linear layer's weight) half the time."""
    g = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=g))

    for _ in range(count):
        m = 1 if draw(0, 2) == 0 else draw(1, 40)
        n = 1 if draw(0, 2) == 0 else draw(1, 40)
        yield draw(2, 6), m, draw(1, 70), n, bool(draw(0, 1))


def test_a_batched_products_members_are_their_own_products_whatever_the_shape():
    """The property a pack relies on (:mod:`nltrain._member_products`): each member of a
    batched product gets the bytes of its own product, as a batch of one and as a plain matrix
    product, on shapes drawn at random rather than listed."""
    g = torch.Generator().manual_seed(12)
    for members, m, k, n, transposed in _batched_cases():
        a = torch.randn(members, m, k, generator=g, dtype=torch.float64)
        b = torch.randn(members, *((n, k) if transposed else (k, n)), generator=g, dtype=a.dtype)
        b = b.transpose(1, 2) if transposed else b
        batched = torch.bmm(a, b)
        for j in range(members):
            case = (members, m, k, n, transposed, j)
            assert torch.equal(batched[j], torch.bmm(a[j : j + 1], b[j : j + 1])[0]), case
            assert torch.equal(batched[j], a[j] @ b[j]), case


def test_a_members_products_do_not_depend_on_its_pack():
    g = torch.Generator().manual_seed(11)
    w = torch.randn(5, 7, 3, generator=g, dtype=torch.float64)
    x = torch.randn(5, 10, 3, generator=g, dtype=torch.float64)
    packed = vmap(lambda wi, xi: torch.tanh(xi @ wi.T))(w, x)
    for i in range(5):
        assert torch.equal(packed[i], torch.tanh(x[i] @ w[i].T))


def _product_by(which: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """``a [B, m, k] @ b [B, k, n]`` by ``nl_matmul_isa``'s code ``which`` (through the
    operands' own strides); None where this CPU cannot run that code."""
    from nlmodels.accel import native

    batch, m, k = a.shape
    n = b.shape[2]
    out = torch.empty(batch, m, n, dtype=torch.float64)
    status = native.library().nl_matmul_isa(
        which, batch, m, n, k, a.data_ptr(), *a.stride(), b.data_ptr(), *b.stride(),
        out.data_ptr(),
    )  # fmt: skip
    assert status in (0, 2), status
    return None if status else out


def _strided_operand(g: torch.Generator, batch: int, rows: int, cols: int, layout: int):
    """[batch, rows, cols] float64 as laid out by ``layout``: 0 contiguous, 1 each matrix
    transposed, 2 every other column of a wider matrix, 3 one matrix broadcast over the batch."""
    if layout == 1:
        return torch.randn(batch, cols, rows, generator=g, dtype=torch.float64).transpose(1, 2)
    if layout == 2:
        return torch.randn(batch, rows, 2 * cols, generator=g, dtype=torch.float64)[:, :, ::2]
    if layout == 3:
        return torch.randn(1, rows, cols, generator=g, dtype=torch.float64).expand(batch, -1, -1)
    return torch.randn(batch, rows, cols, generator=g, dtype=torch.float64)


def test_the_tiled_products_are_the_plain_loop_bit_for_bit():
    """The register tiles (256- and 512-bit, the latter where the CPU has AVX-512F) with their
    cache blocks, and the unpacked row blocks of small products, give every element the plain
    loop's bits (the loop is the definition, checked
    against exact rationals first): shapes drawn across the tiles' edges (6 x 8, 12 x 16), the
    blocks of inner indices (256) and rows (96), narrow products, every operand layout."""
    g = torch.Generator().manual_seed(55)
    a = torch.randn(1, 7, 300, generator=g, dtype=torch.float64)
    b = torch.randn(1, 300, 3, generator=g, dtype=torch.float64)
    plain = _product_by(0, a, b)
    assert plain is not None
    assert np.array_equal(plain[0].numpy(), _reference_product(a[0].numpy(), b[0].numpy()))
    codes_run = set()

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=g))

    for case in range(60):
        m, k, n = draw(1, 40), draw(1, 70), draw(1, 40)
        if case % 6 == 0:  # across the blocks: rows past 96, inner indices past 256
            m, k = draw(90, 200), draw(250, 520)
        batch = draw(1, 3)
        a = _strided_operand(g, batch, m, k, draw(0, 3)) * 4.0
        b = _strided_operand(g, batch, k, n, draw(0, 3))
        plain = _product_by(0, a, b)
        for which in (1, 2, 3):
            tiled = _product_by(which, a, b)
            if tiled is not None:
                codes_run.add(which)
                assert torch.equal(tiled, plain), (which, batch, m, k, n, a.stride(), b.stride())
        assert torch.equal(torch.bmm(a, b), plain), (batch, m, k, n)
    assert {1, 3} <= codes_run  # every x86-64-v3 CPU runs these


def test_operands_read_in_place_give_the_plain_loops_bits():
    """Neural Laplace's decoder's products at a chunk's sizes (rows 1900 = 19 trajectories x
    100 times, 64 units, 132 outputs), each operand as the decoder lays it out: the tiles read
    full panels of a (rows or columns contiguous) and of b (rows contiguous) in place where they
    are read few times, pack the rest and the partial panels; every element is the plain loop's."""
    g = torch.Generator().manual_seed(3)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(1, *shape, generator=g, dtype=torch.float64)

    rows = 1900
    h1, h2, g_z2, w2, w3, g_out_t = (
        r(rows, 64),
        r(rows, 64),
        r(rows, 64),
        r(64, 64),
        r(132, 64),
        r(132, rows),
    )
    products = [
        (h1, w2.transpose(1, 2)),  # first hidden to second
        (w3, h2.transpose(1, 2)),  # output layer, transposed
        (g_out_t, h2),  # its weight gradient
        (g_out_t.transpose(1, 2), w3),  # back to the second hidden layer
        (g_z2.transpose(1, 2), h1),  # the second layer's weight gradient
        (g_z2, w2),  # back to the first
    ]
    for a, b in products:
        plain = _product_by(0, a, b)
        for which in (1, 2):
            tiled = _product_by(which, a, b)
            assert tiled is None or torch.equal(tiled, plain), (which, a.stride(), b.stride())


FUNCTIONS = {
    "exp": mpmath.exp,
    "expm1": mpmath.expm1,
    "log": mpmath.log,
    "log1p": mpmath.log1p,
    "log2": lambda x: mpmath.log(x, 2),
    "log10": mpmath.log10,
    "sin": mpmath.sin,
    "cos": mpmath.cos,
    "tan": mpmath.tan,
    "asin": mpmath.asin,
    "acos": mpmath.acos,
    "atan": mpmath.atan,
    "sinh": mpmath.sinh,
    "cosh": mpmath.cosh,
    "tanh": mpmath.tanh,
    "asinh": mpmath.asinh,
    "acosh": mpmath.acosh,
    "atanh": mpmath.atanh,
    "erf": mpmath.erf,
    "erfc": mpmath.erfc,
    "erfinv": mpmath.erfinv,
    "sqrt": mpmath.sqrt,
}


def _domain(name: str, n: int = 203) -> torch.Tensor:
    g = torch.Generator().manual_seed(len(name))
    u = torch.rand(n, generator=g, dtype=torch.float64)
    if name in ("asin", "acos", "atanh", "erfinv"):
        return u * 1.98 - 0.99
    if name in ("log", "log2", "log10", "sqrt"):
        return torch.exp(u * 20.0 - 10.0)
    if name == "acosh":
        return 1.0 + u * 50.0
    if name == "log1p":
        return u * 10.0 - 0.9
    return u * 16.0 - 8.0


def _ulps(got: float, want: mpmath.mpf) -> float:
    want_f = float(want)
    if want_f == 0.0:
        return abs(got) / 5e-324
    return abs(got - want) / math.ulp(want_f)


def test_every_replaced_function_is_one_of_the_list():
    assert set(FUNCTIONS) == set(portable.ELEMENTARY)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_elementary_functions_against_mpmath(name):
    """Within 4 ulp of the exact value (erfinv, whose Newton steps use erf: 8), float64 and
    float32; and an element's bits do not depend on its place in the array."""
    x = _domain(name)
    y = getattr(torch, name)(x)
    mpmath.mp.prec = 120
    worst = max(_ulps(g, FUNCTIONS[name](mpmath.mpf(v))) for v, g in zip(x.tolist(), y.tolist()))
    assert worst <= (8.0 if name == "erfinv" else 4.0), f"{name}: {worst:.1f} ulp"
    for start in (1, 2, 3, 5):  # other vector lanes and tails
        assert torch.equal(getattr(torch, name)(x[start:]), y[start:])
    assert torch.equal(getattr(torch, name)(x.view(7, 29).T.contiguous()).T, y.view(7, 29))
    y32 = getattr(torch, name)(x.float())
    assert torch.equal(y32, getattr(torch, name)(x.float().double()).float())


def test_special_values_follow_ieee():
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan], dtype=torch.float64)
    assert torch.exp(special).tolist()[:4] == [1.0, 1.0, math.inf, 0.0]
    assert math.copysign(1.0, torch.tanh(special)[1].item()) == -1.0
    assert torch.isnan(torch.sin(special)[2:]).all()
    assert torch.log(torch.tensor([0.0, -1.0], dtype=torch.float64)).tolist()[0] == -math.inf
    assert math.isnan(torch.sqrt(torch.tensor(-1.0, dtype=torch.float64)).item())


def test_complex_elementary_functions_against_cmath():
    z = torch.complex(_domain("exp", 40) / 4, _domain("sin", 40) / 3)
    for name in ("exp", "log", "sin", "cos", "tanh", "sqrt"):
        got = getattr(torch, name)(z).tolist()
        want = [getattr(cmath, name)(complex(v)) for v in z.tolist()]
        assert all(abs(g - w) <= 1e-14 * max(1.0, abs(w)) for g, w in zip(got, want)), name
    with pytest.raises(RuntimeError, match="complex"):
        torch.erf(z)


def test_integer_input_promotes_as_torch_does():
    y = torch.exp(torch.arange(3))
    assert y.dtype == torch.get_default_dtype()
    assert y.tolist() == pytest.approx([1.0, math.e, math.e**2])


def test_gradients_flow_through_the_portable_kernels():
    g = torch.Generator().manual_seed(5)
    a = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)

    def f(a, b, v):
        h = torch.tanh(torch.addmm(torch.ones(2, dtype=torch.float64), a, b))
        return torch.exp(h).sum() + torch.sin(a @ v).sum() + torch.log1p(torch.dot(v, v))

    assert torch.autograd.gradcheck(f, (a, b, v))


def test_set_up_is_idempotent_and_says_what_runs():
    setup = nlmodels.require_numerics()
    assert setup.kernels == "portable" and setup.mode == "portable"
    assert nlmodels.set_up_numerics() is setup
    assert "kernels=portable" in nlmodels.numerics_tag()


def _each_form(a, b, c, bias):
    """Every operator the C++ registration serves, in each form, on the given operands (and the
    cases it hands to the Python definitions: other dtypes, NaN ignored by beta = 0)."""
    out = torch.empty(0, dtype=a.dtype)
    nan_self = torch.full((a.shape[0], b.shape[1]), math.nan, dtype=a.dtype)
    in_place = bias.expand(a.shape[0], b.shape[1]).clone()
    batch = torch.stack([a, a.flip(0)])
    results = [
        torch.mm(a, b),
        torch.mm(a.T.contiguous().T, b[:, ::2]),
        torch.mm(a, b, out=out).clone(),
        torch.bmm(batch, torch.stack([b, b])),
        torch.addmm(bias, a, b),
        torch.addmm(bias, a, b, beta=0.5, alpha=3.0),
        torch.addmm(nan_self, a, b, beta=0),
        in_place.addmm_(a, b, beta=2, alpha=0.25),
        torch.baddbmm(bias, batch, torch.stack([b, b]), alpha=-1.5),
        torch.mm(a.float(), b.float()),
        torch.mm(a.to(torch.complex128), b.to(torch.complex128)),
    ]
    for name in portable.ELEMENTARY:
        x = c.abs() / (c.abs().max() + 1)  # inside every function's domain
        y = x.clone()
        results += [getattr(torch, name)(x), getattr(torch, name)(x.T), getattr(y, f"{name}_")()]
        results.append(getattr(torch, name)(x.float()))
    return results


def test_the_cpp_registration_computes_the_python_definitions_bits():
    """The operators registered from C++ (``dispatch.cpp``) give the bits of the Python
    definitions they stand for, in every form, and hand other cases (dtypes, errors) on."""
    if portable.dispatch() != "C++":
        pytest.skip(f"the C++ registration is not in use here ({portable.dispatch()})")
    g = torch.Generator().manual_seed(11)
    a = torch.randn(13, 9, generator=g, dtype=torch.float64)
    b = torch.randn(9, 10, generator=g, dtype=torch.float64)
    c = torch.randn(10, 7, generator=g, dtype=torch.float64)
    bias = torch.randn(10, generator=g, dtype=torch.float64)
    in_cpp = _each_form(a, b, c, bias)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(a, a)
    try:
        portable.uninstall()
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(portable.DISPATCH_VARIABLE, "python")
            assert portable.install() and portable.dispatch() == "Python"
            in_python = _each_form(a, b, c, bias)
    finally:
        portable.uninstall()
        portable.install()
    assert portable.dispatch() == "C++"
    assert len(in_cpp) == len(in_python)
    for i, (x, y) in enumerate(zip(in_cpp, in_python)):
        assert x.dtype == y.dtype and x.shape == y.shape, i
        assert torch.equal(_bits(x), _bits(y)), i  # NaN included


def _bits(t: torch.Tensor) -> torch.Tensor:
    real = torch.view_as_real(t) if t.is_complex() else t
    return real.contiguous().view(-1).view(torch.int64 if real.element_size() == 8 else torch.int32)


def test_the_cpp_registration_is_used_where_a_cpp_compiler_is():
    import os
    import shutil

    if os.environ.get(portable.DISPATCH_VARIABLE, "").lower() == "python":
        pytest.skip(f"{portable.DISPATCH_VARIABLE}=python")
    if shutil.which(os.environ.get("CXX") or "c++") is None:
        pytest.skip("no C++ compiler")
    assert portable.dispatch() == "C++"


class _ProductsOff:
    """``nl_matmul_isa`` whose code ``wrong`` is one ulp off in one element: what the library's
    self-test must refuse."""

    def __init__(self, real, wrong: int) -> None:
        self.real, self.wrong = real, wrong
        self.restype, self.argtypes = None, None  # (the self-test declares them)

    def __call__(self, which, *args):
        status = self.real(which, *args)
        if which == self.wrong and status == 0:
            c = ctypes.cast(args[-1], ctypes.POINTER(ctypes.c_double))
            c[0] = math.nextafter(c[0], math.inf)
        return status


def _code_runs(library, which: int) -> bool:
    one, out = (ctypes.c_double * 1)(1.0), (ctypes.c_double * 1)()
    a, c = ctypes.addressof(one), ctypes.addressof(out)
    return library.nl_matmul_isa(which, 1, 1, 1, 1, a, 1, 1, 1, a, 1, 1, 1, c) != 2


@pytest.mark.skipif(not native.usable(), reason="the native kernels do not build here")
def test_the_librarys_self_test_holds_every_product_code_to_the_plain_loops_bits():
    """Where the library loads it checks every product path (the narrow one the paper's cells
    take included) against the plain loop, so a path that drifts is refused there."""
    from nlmodels.accel.native._selftest import self_test

    library = native.library()
    assert self_test(library) is None
    runnable = [w for w in (1, 2, 3) if _code_runs(library, w)]
    assert runnable, "no product code besides the plain loop runs here"
    for which in runnable:
        off = types.SimpleNamespace(
            **{name: getattr(library, name) for name in ("nl_vector_math", "nl_bias_tanh")}
        )
        off.nl_matmul_isa = _ProductsOff(library.nl_matmul_isa, which)
        problem = self_test(off)
        assert problem is not None and f"code {which}" in problem, problem
