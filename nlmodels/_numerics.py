"""The one process-wide numerics setting the platform fixes: Intel MKL's strict conditional
numerical reproducibility (``MKL_CBWR=AUTO,STRICT``; Intel, *Developer Reference for oneMKL*,
"Obtaining Numerically Reproducible Results").

By default MKL's double-precision matrix products round differently when an operand or the
result is not 32-byte aligned. A packed model's batched products (``bmm`` under ``vmap``) put
member ``j``'s result at offset ``j × out × in``: with layers such as 31 × 31 (the coupling
flow) the members after the first sit unaligned, and a cell's bytes depended on its position in
its pack. Strict mode gives the same bytes at any alignment. MKL reads the setting when it
starts (at torch's first matrix product), so it is set when this package is imported; a value
the user set is kept. :func:`mkl_position_independent` checks that it took effect.
"""

from __future__ import annotations

import os

MKL_CBWR = "AUTO,STRICT"
os.environ.setdefault("MKL_CBWR", MKL_CBWR)

__all__ = ["MKL_CBWR", "mkl_position_independent", "numerics_tag"]

_CHECKED: list[bool] = []


def mkl_position_independent() -> bool:
    """Whether a batched product gives a member the same bytes at an unaligned offset as at an
    aligned one (False: MKL started before this package set its mode, e.g. after a matrix
    product in the importing program)."""
    if not _CHECKED:
        import torch

        g = torch.Generator().manual_seed(0)
        a = torch.randn(1, 31, 32, generator=g, dtype=torch.float64).expand(2, -1, -1)
        b = torch.randn(1, 32, 31, generator=g, dtype=torch.float64).expand(2, -1, -1)
        out = torch.bmm(a.contiguous(), b.contiguous())
        _CHECKED.append(bool(torch.equal(out[0], out[1])))
    return _CHECKED[0]


def numerics_tag() -> str:
    """What a run records of the process's numerics: the MKL mode asked for, whether members'
    bytes are independent of their position in a pack, and torch's intra-op threads (parallel
    reductions split by thread: a cell's bytes depend on the count, which runs pin)."""
    import torch

    mode = os.environ.get("MKL_CBWR", "") or "default"
    return (
        f"mkl_cbwr={mode}; position_independent={mkl_position_independent()}; "
        f"torch_threads={torch.get_num_threads()}"
    )
