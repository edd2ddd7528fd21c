"""Python's cyclic garbage collector kept off the objects a training finds when it starts."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_frozen"]

_lock = threading.Lock()
_holders = 0  # blocks inside collector_frozen, all threads
_froze = False  # whether the first of them froze (nobody had frozen before it)


@contextmanager
def collector_frozen() -> Iterator[None]:
    """The objects alive when the block starts moved to the collector's permanent generation
    (:func:`gc.freeze`) for the block, and back to its oldest one afterwards (:func:`gc.unfreeze`).

    A training step allocates container objects (autograd's nodes, tensors' Python parts) fast
    enough to start a collection every few steps, and each pass over the oldest generation walks
    every module, class and function the process has imported (torch's, MLflow's, Prefect's):
    frozen, they are not walked; the training's own objects are collected as before, and
    reference counting frees everything as before. Nothing computed depends on it. Nested and
    concurrent blocks (trainings in threads) freeze once, the last to end unfreezes; where
    something else had frozen objects already, the block leaves the collector as it is.
    """
    global _holders, _froze
    with _lock:
        if _holders == 0:
            _froze = gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _froze:
                gc.unfreeze()
                _froze = False
