"""The one choice between the fast paths and the plain formulas of the model."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Literal

import torch

from nlmodels.accel import native

Backend = Literal["native", "torch", "plain"]

_FORCED = threading.local()


@contextlib.contextmanager
def plain_formulas() -> Iterator[None]:
    """Inside this block :func:`select` answers ``plain`` (in this thread): the model runs its own
    formulas, as it does under ``torch.func.vmap`` (packed training), e.g. to compare an unpacked
    run with a packed one operation for operation."""
    previous = getattr(_FORCED, "plain", False)
    _FORCED.plain = True
    try:
        yield
    finally:
        _FORCED.plain = previous


def transformed(*tensors: torch.Tensor) -> bool:
    """Whether any tensor is wrapped by a ``torch.func`` transform (``vmap``, ``grad``): the fast
    paths' custom autograd functions and C calls have no batching rule."""
    return any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)


def select(*tensors: torch.Tensor) -> Backend:
    """Which implementation runs on these tensors:

    * ``plain``: under ``torch.compile``, under a ``torch.func`` transform (``vmap`` of packed
      training) or inside :func:`plain_formulas`, the model's own formulas (``nn.GRU``, g then
      the ILT sum), which the compiler can trace and vmap can batch (the fast paths'
      hand-written backward passes and C calls they cannot);
    * ``native``: every tensor float64 on the CPU and the C kernels load (``NLLAB_NATIVE``, see
      :mod:`nlmodels.accel.native`);
    * ``torch``: otherwise, the fast paths' torch twins.
    """
    if torch.compiler.is_compiling() or getattr(_FORCED, "plain", False) or transformed(*tensors):
        return "plain"
    return "native" if native.usable(*tensors) else "torch"
