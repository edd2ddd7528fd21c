"""Self-test of a built kernel library, without torch: ``python -I _selftest.py LIBRARY``.

A new build is first tested by running this file as a script in a child process, so that a
library that cannot run on this CPU (an illegal instruction, a crash) kills the child and not
the caller; the loader then runs :func:`self_test` in-process on the library it loaded. The
check calls the vector maths kernel on a few points against :mod:`math` and one decoder kernel
against its formula, so a library that loads but computes wrong numbers is refused too.
"""

from __future__ import annotations

import ctypes
import math
import sys

#: Points and the kernel's ops (0 exp, 1 sigmoid, 2 tanh, 3 sin, 4 cos) with their references.
_POINTS = (-30.5, -2.25, -1e-6, 0.0, 3e-9, 0.5, 1.75, 12.0, 40.0)
_OPS = {
    0: math.exp,
    1: lambda x: 1.0 / (1.0 + math.exp(-x)),
    2: math.tanh,
    3: math.sin,
    4: math.cos,
}
_TOLERANCE = 1e-13  # relative; the kernels are accurate to a few ulp


def _array(values: list[float]) -> ctypes.Array:
    return (ctypes.c_double * len(values))(*values)


def _close(got: float, expected: float) -> bool:
    return abs(got - expected) <= _TOLERANCE * max(1.0, abs(expected))


def self_test(library: ctypes.CDLL) -> str | None:
    """None when the library computes what it should, else what went wrong."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    vector_math = library.nl_vector_math
    vector_math.restype, vector_math.argtypes = None, [ctypes.c_int, i64, ptr, ptr]
    n = len(_POINTS)
    for op, reference in _OPS.items():
        x, y = _array(list(_POINTS)), _array([math.nan] * n)
        vector_math(op, n, ctypes.addressof(x), ctypes.addressof(y))
        for value, got in zip(_POINTS, y):
            if not _close(got, reference(value)):
                return f"nl_vector_math op {op} at {value}: {got!r}, expected {reference(value)!r}"
    # h = tanh(h + bias) over 3 rows of 5 units (a partial vector on every row)
    rows, units = 3, 5
    h0 = [0.1 * (k - 7) for k in range(rows * units)]
    bias = [0.3 * k - 0.6 for k in range(units)]
    h, b = _array(h0), _array(bias)
    bias_tanh = library.nl_bias_tanh
    bias_tanh.restype, bias_tanh.argtypes = None, [i64, i64, ptr, ptr]
    bias_tanh(rows, units, ctypes.addressof(h), ctypes.addressof(b))
    for k, got in enumerate(h):
        expected = math.tanh(h0[k] + bias[k % units])
        if not _close(got, expected):
            return f"nl_bias_tanh element {k}: {got!r}, expected {expected!r}"
    return _products_agree(library)


#: Products ``[m, k] @ [k, n]`` that take each path of the product codes: the tiles' blocks with
#: edges, and a narrow product (few columns, many rows) that the tiles compute transposed.
_PRODUCT_SHAPES = ((13, 11, 9), (40, 2, 7), (37, 3, 130), (1, 1, 1))


def _product(matmul, which: int, operands: tuple[int, ...]) -> tuple[int, list[float]]:
    """``nl_matmul_isa``'s status and product by code ``which``, one ``[m, k] @ [k, n]``."""
    m, n = operands[:2]
    c = _array([math.nan] * (m * n))
    return matmul(which, 1, *operands, ctypes.addressof(c)), list(c)


def _products_agree(library: ctypes.CDLL) -> str | None:
    """Every product code this CPU runs gives the plain loop's bits (``nl_matmul_isa``: the
    codes promise the same multiply-adds per element in the same order). Run wherever the
    library loads, the numerics canaries' processes included, so every path of the products is
    held to the plain loop's bits there, not only the paths the canaries' small sizes take."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    matmul = library.nl_matmul_isa
    matmul.restype = ctypes.c_int
    matmul.argtypes = [ctypes.c_int, i64, i64, i64, i64, ptr, i64, i64, i64]
    matmul.argtypes += [ptr, i64, i64, i64, ptr]
    for m, n, k in _PRODUCT_SHAPES:
        a = _array([math.sin(0.7 * i + 0.3) for i in range(m * k)])
        b = _array([math.cos(1.1 * i - 0.4) / (1 + i % 5) for i in range(k * n)])
        operands = (m, n, k, ctypes.addressof(a), m * k, k, 1, ctypes.addressof(b), k * n, n, 1)
        shape = f"[{m}, {k}] @ [{k}, {n}]"
        status, plain = _product(matmul, 0, operands)
        if status:
            return f"nl_matmul_isa's plain loop refused {shape}"
        for which in (1, 2, 3):
            status, got = _product(matmul, which, operands)
            if status != 2 and (status or got != plain):  # (2: a code this CPU cannot run)
                return f"nl_matmul_isa code {which} on {shape}: not the plain loop's bits"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: _selftest.py LIBRARY", file=sys.stderr)
        return 2
    problem = self_test(ctypes.CDLL(argv[1]))
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
