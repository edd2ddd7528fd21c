"""torch's CPU thread count for a block of work, put back afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["torch_threads"]


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's CPU threads set to ``n`` for the block and put back after it.

    The count is process-wide, and a reduction split over another number of threads rounds
    differently: a caller training in threads of its own sets it once around all of them, so
    that no training's count changes while it runs.
    """
    if n < 1:
        raise ValueError(f"torch's thread count must be >= 1, got {n}")
    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
