"""Matrix–vector products of a pack computed member by member, as a pack of one computes them.

Under ``vmap`` a member's matrix product is one item of a batched product (``aten::bmm``) whose
batch is the pack. On the CPU, torch sends a batch of one to MKL's ``gemm`` and a batch of
several to MKL's ``gemm_batch_strided`` (ATen ``cpublas::gemm_batched_with_stride``); the two
give the same bytes for matrices but not for matrix–vector shapes (an output with one row or one
column: MKL's ``gemm`` then runs its ``gemv``), which MKL's strict CNR mode does not cover
(it fixes one routine's rounding, not two routines'). A 1-D system makes such products in every
step (a last layer with one output, the weight gradient of a layer with one input), so a member
of a pack of several got other bytes than alone (a pack of one).

:class:`MemberProducts` computes those products as one batch-of-one product per member: exactly
the call its pack of one makes. It runs as a ``TorchDispatchMode`` (a Python call per operator)
only where a step has such a product: the first step of each shape finds out, later ones of that
shape run without it when it had none.

Under the portable CPU numerics (:mod:`nlmodels.accel.portable`, the default) it is not needed
and stays off: every element of a product has one definition there (its first product, then
fused multiply-adds in increasing inner index), whatever the batch it is computed in, so a
batched product is its members' batch-of-one products by construction, and a 1-D pack trains
without a Python call per operator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["MemberProducts"]

_BMM = torch.ops.aten.bmm.default


def _portable() -> bool:
    """Whether the portable kernels compute this process's CPU products (see the module's
    docstring: then a batch cannot change a member's bytes)."""
    from nlmodels import portable_cpu_kernels

    return portable_cpu_kernels()


class _PerMember(TorchDispatchMode):
    """Splits a ``bmm`` whose batch is the ``m`` members (one product each) and whose result is
    a matrix–vector shape into ``m`` batch-of-one ``bmm`` calls."""

    def __init__(self, m: int) -> None:
        super().__init__()
        self.m = m
        self.split = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _BMM and not kwargs:
            a, b = args
            if a.shape[0] == self.m and (a.shape[1] == 1 or b.shape[2] == 1):
                self.split = True
                return torch.cat([_BMM(a[j : j + 1], b[j : j + 1]) for j in range(self.m)])
        return func(*args, **kwargs)


class MemberProducts:
    """Where a pack of several members on the CPU computes its matrix–vector products member by
    member (see the module's docstring); whether a step needs it, per step shape ``key``."""

    def __init__(self, device: torch.device) -> None:
        self.enabled = torch.device(device).type == "cpu"
        self.needed: dict[Hashable, bool] = {}

    @contextlib.contextmanager
    def scope(self, key: Hashable, members: int) -> Iterator[None]:
        """Run the enclosed step of a pack of ``members`` (shape ``key``: the same operators on
        the same shapes each time) with its matrix–vector products computed member by member."""
        key = (key, members)
        if not self.enabled or members == 1 or self.needed.get(key) is False or _portable():
            yield
            return
        mode = _PerMember(members)
        with mode:
            yield
        if key not in self.needed:
            self.needed[key] = mode.split
