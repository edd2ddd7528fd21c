"""The one choice between the fast paths: the native C kernels or their torch twins."""

from __future__ import annotations

from typing import Literal

import torch

from nlmodels.accel import native

Backend = Literal["native", "torch"]


def select(*tensors: torch.Tensor) -> Backend:
    """``native`` when every tensor is float64 on the CPU and the kernels load (see
    :mod:`nlmodels.accel.native` for ``NLLAB_NATIVE``), else ``torch``."""
    return "native" if native.usable(*tensors) else "torch"
