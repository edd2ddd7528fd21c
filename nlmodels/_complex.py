"""Complex matrix products in real arithmetic, for models whose gradients flow through them.

Autograd's backward of a complex product multiplies by the other factor's conjugate, a lazily
conjugated view; the portable CPU kernels (:mod:`nlmodels.accel.portable`) read their operands'
memory and ignore that flag, so a complex ``@`` would back-propagate wrong gradients in the
platform's default numerics mode. Four real products have none of that.
"""

from __future__ import annotations

import torch

__all__ = ["complex_matmul"]


def complex_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for complex ``a``, ``b`` (torch.matmul's broadcasting), by real products."""
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    return torch.complex(ar @ br - ai @ bi, ar @ bi + ai @ br)
