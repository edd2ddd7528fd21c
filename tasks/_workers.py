"""Optional worker processes for training cells.

Threads of one process share the GIL, torch's global RNG and some process-global torch state
(``torch.nn.utils.parametrize.cached`` keeps one module-level cache, so two models using it in
two threads corrupt each other's autograd graphs). Cells therefore train in a small pool of
spawned processes by default; the Prefect task (a thread) just waits for its cell's result.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, ProcessPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

__all__ = [
    "WorkerStopped",
    "run_in_worker",
    "worker_pool_active",
    "worker_processes",
    "worker_stop_event",
]

T = TypeVar("T")
_POOL: ProcessPoolExecutor | None = None
# In a worker: set by the parent when the flow is interrupted, so running cells stop and end
# KILLED (workers ignore SIGINT themselves, so the parent decides for all of them).
_WORKER_STOP = None


def _init_worker(stop) -> None:
    global _WORKER_STOP
    _WORKER_STOP = stop
    # A terminal's Ctrl-C reaches the whole process group, these workers included. Only the
    # parent acts on it (it sets ``stop``): a KeyboardInterrupt here would kill an idle worker
    # (breaking the pool) or escape from a cell before its run is ended KILLED.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def worker_stop_event():
    """The interruption event of this worker process, or ``None`` outside workers."""
    return _WORKER_STOP


@contextmanager
def worker_processes(n: int) -> Iterator[None]:
    """Run :func:`run_in_worker` calls in ``n`` spawned processes while the block runs."""
    global _POOL
    if _POOL is not None:
        raise RuntimeError("worker processes are already running in this process")
    # 'spawn': the caller has threads (Prefect), which 'fork' does not copy safely.
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    _POOL = ProcessPoolExecutor(
        max_workers=n, mp_context=ctx, initializer=_init_worker, initargs=(stop,)
    )
    try:
        yield
    except BaseException:
        stop.set()
        raise
    finally:
        # Calls submitted while it shuts down fail with WorkerStopped instead of running here.
        _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL = None


def worker_pool_active() -> bool:
    return _POOL is not None


class WorkerStopped(RuntimeError):
    """The pool was stopped (Ctrl-C) before this call started; it never ran."""


def _unless_stopped(fn: Callable[..., T], *args: object) -> T:
    # The pool queues a call or two ahead; one dequeued after Ctrl-C must not start.
    if _WORKER_STOP is not None and _WORKER_STOP.is_set():
        raise WorkerStopped("interrupted before it started")
    return fn(*args)


def run_in_worker(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a worker process if a pool is running, else in the calling thread.

    Raises :class:`WorkerStopped` when the pool was stopped before the call started.
    """
    if _POOL is None:
        return fn(*args)
    try:
        future = _POOL.submit(_unless_stopped, fn, *args)
    except RuntimeError:  # "cannot schedule new futures after shutdown"
        raise WorkerStopped("interrupted before it started") from None
    try:
        return future.result()
    except CancelledError:
        raise WorkerStopped("interrupted before it started") from None
