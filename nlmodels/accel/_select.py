"""The one choice between the fast paths and the plain formulas of the model."""

from __future__ import annotations

from typing import Literal

import torch

from nlmodels.accel import native

Backend = Literal["native", "torch", "plain"]


def select(*tensors: torch.Tensor) -> Backend:
    """Which implementation runs on these tensors:

    * ``plain``: under ``torch.compile``, the model's own formulas (``nn.GRU``, g then the ILT
      sum), which the compiler can trace and fuse (the fast paths' hand-written backward
      passes and C calls it cannot);
    * ``native``: every tensor float64 on the CPU and the C kernels load (``NLLAB_NATIVE``, see
      :mod:`nlmodels.accel.native`);
    * ``torch``: otherwise, the fast paths' torch twins.
    """
    if torch.compiler.is_compiling():
        return "plain"
    return "native" if native.usable(*tensors) else "torch"
