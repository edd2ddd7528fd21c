"""Optional worker processes for training cells.

Threads of one process share the GIL, torch's global RNG and some process-global torch state
(``torch.nn.utils.parametrize.cached`` keeps one module-level cache, so two models using it in
two threads corrupt each other's autograd graphs). Cells therefore train in a small pool of
spawned processes by default; the Prefect task (a thread) just waits for its cell's result.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

__all__ = [
    "WorkerDied",
    "WorkerStopped",
    "run_in_worker",
    "usable_cores",
    "worker_pids",
    "worker_pool_active",
    "worker_processes",
    "worker_stop_event",
    "worker_threads",
]

T = TypeVar("T")
_POOL: _Pool | None = None
#: Seconds within which a caller's stop event reaches the workers (:func:`worker_processes`).
LINK_SECONDS = 0.5
# In a worker: set by the parent when the flow is interrupted, so running cells stop and end
# KILLED (workers ignore SIGINT themselves, so the parent decides for all of them).
_WORKER_STOP = None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_threads(torch_threads: int | None, max_workers: int) -> int:
    """torch's CPU threads in one worker: ``torch_threads`` when set, else this machine's
    cores shared among the ``max_workers`` workers that train at once."""
    if torch_threads is not None:
        return torch_threads
    return max(1, usable_cores() // max(1, max_workers))


def _init_worker(stop) -> None:
    global _WORKER_STOP
    _WORKER_STOP = stop
    # A terminal's Ctrl-C reaches the whole process group, these workers included, and so does
    # a SIGTERM sent to the group (systemd's control-group kill, ``kill -- -PGID``). Only the
    # parent acts on them (it sets ``stop``): dying here would fail a cell instead of ending its
    # run KILLED, and leave the pool's semaphores behind. A worker whose parent is gone stops
    # by itself (``_watch_parent``); the pool ends a stuck one with SIGKILL.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The parent's CPU numerics (its environment is inherited) before this process computes.
    import nlmodels

    nlmodels.set_up_numerics()


def _watch_parent(parent: int) -> None:
    """Once the parent is gone (``kill -9``), stop the running cell at its next batch (its run
    ends KILLED) and end this worker: no orphan trains on for a command that no longer exists."""
    while os.getppid() == parent:
        time.sleep(0.5)
    if _WORKER_STOP is not None:
        _WORKER_STOP.set()
    time.sleep(30)
    os._exit(1)


def _worker_main(conn: Connection, stop) -> None:
    """A worker's loop: run each ``(fn, args)`` it receives, send back ``(ok, value)``."""
    _init_worker(stop)
    watcher = threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True)
    watcher.start()
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if job is None:
            return
        fn, args = job
        try:
            reply = (True, _unless_stopped(fn, *args))
        except BaseException as e:  # sent to the caller, who re-raises it
            reply = (False, e)
        try:
            try:
                conn.send(reply)
            except (OSError, EOFError):
                raise
            except Exception as e:  # an unpicklable result or error
                conn.send((False, RuntimeError(f"{type(e).__name__}: {e}")))
        except (OSError, EOFError):
            return  # the parent is gone


def worker_stop_event():
    """The interruption event of this worker process, or ``None`` outside workers."""
    return _WORKER_STOP


class WorkerStopped(RuntimeError):
    """The pool was stopped (Ctrl-C) before this call started; it never ran."""


class WorkerDied(RuntimeError):
    """The worker process ``pid`` running this call died (``kill -9``, ``SIGTERM``, out of
    memory) before it returned."""

    def __init__(self, message: str, pid: int) -> None:
        super().__init__(message)
        self.pid = pid

    def __reduce__(self):
        return type(self), (str(self), self.pid)


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple
    future: Future = field(default_factory=Future)


@dataclass
class _Worker:
    process: Any  # multiprocessing.Process of the spawn context
    conn: Connection
    job: _Job | None = None


class _Pool:
    """Up to ``n`` spawned worker processes, one call at a time each, with explicit bookkeeping
    of which call each one runs: a worker that dies fails its own call (:class:`WorkerDied`)
    and is replaced on demand, while the others go on. (``concurrent.futures``'
    ``ProcessPoolExecutor`` instead marks itself broken and terminates every worker.)
    """

    def __init__(self, n: int, linked: threading.Event | None = None) -> None:
        # 'spawn': the caller has threads (Prefect), which 'fork' does not copy safely.
        self._ctx = multiprocessing.get_context("spawn")
        self.stop = self._ctx.Event()
        #: the caller's stop event, passed on to :attr:`stop` (a thread event cannot cross
        #: processes): checked by the manager at least every :data:`LINK_SECONDS`
        self._linked = linked
        self._n = max(1, n)
        self._lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._workers: list[_Worker] = []
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        self._closing = False
        self._manager = threading.Thread(target=self._manage, name="nllab-workers", daemon=True)
        self._manager.start()

    def submit(self, fn: Callable[..., T], *args: object) -> Future:
        job = _Job(fn, args)
        with self._lock:
            if self._closing:
                raise WorkerStopped("interrupted before it started")
            self._queue.append(job)
        self._wake()
        return job.future

    def shutdown(self) -> None:
        """Cancel queued calls, wait for running ones, end the workers."""
        with self._lock:
            self._closing = True
            queued, self._queue = list(self._queue), deque()
        for job in queued:
            job.future.cancel()
        self._wake()
        self._manager.join()
        self._wake_r.close()
        self._wake_w.close()

    @property
    def pids(self) -> list[int]:
        """The live worker processes (for tests and probes)."""
        with self._lock:
            return [w.process.pid for w in self._workers if w.process.is_alive()]

    def _wake(self) -> None:
        try:
            self._wake_w.send_bytes(b"x")
        except OSError:
            pass

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(
            target=_worker_main, args=(child, self.stop), name="nllab-worker"
        )
        process.start()
        child.close()
        return _Worker(process, parent)

    def _dispatch(self) -> bool:
        """Hand queued calls to idle workers (spawning up to ``n``); whether to keep going."""
        with self._lock:
            while self._queue:
                idle = next((w for w in self._workers if w.job is None), None)
                if idle is None and len(self._workers) < self._n:
                    idle = self._spawn()
                    self._workers.append(idle)
                if idle is None:
                    break
                job = self._queue.popleft()
                if not job.future.set_running_or_notify_cancel():
                    continue
                try:
                    idle.conn.send((job.fn, job.args))
                except Exception as e:  # unpicklable call, or the worker just died
                    job.future.set_exception(e)
                    continue
                idle.job = job
            busy = any(w.job is not None for w in self._workers)
            return not self._closing or bool(self._queue) or busy

    def _manage(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # never leave a caller waiting forever
            with self._lock:
                jobs = [w.job for w in self._workers if w.job] + list(self._queue)
                self._closing, self._queue = True, deque()
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(RuntimeError(f"the worker pool broke: {e!r}"))
            for w in self._workers:
                w.process.kill()
            raise

    def _serve(self) -> None:
        while self._dispatch():
            with self._lock:
                workers = list(self._workers)
            waits: dict[Any, tuple[str, _Worker | None]] = {self._wake_r: ("wake", None)}
            for w in workers:
                waits[w.process.sentinel] = ("died", w)
                if w.job is not None:
                    waits[w.conn] = ("reply", w)
            timeout = LINK_SECONDS if self._linked is not None else None
            for ready in wait(list(waits), timeout):
                kind, sender = waits[ready]
                if kind == "wake":
                    while self._wake_r.poll():
                        self._wake_r.recv_bytes()
                elif kind == "reply" and sender is not None:  # a reply always has its worker
                    self._reply(sender)
            for w in workers:
                if not w.process.is_alive():
                    self._reply(w)  # a reply sent just before it ended still counts
                    self._bury(w)
            if self._linked is not None and self._linked.is_set():
                self.stop.set()
        for w in self._workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self._workers:
            w.process.join()
            w.conn.close()

    def _reply(self, w: _Worker) -> None:
        if w.job is None:
            return
        try:
            if not w.conn.poll():
                return
            ok, value = w.conn.recv()
        except (EOFError, OSError):
            return  # it died: see _bury
        job, w.job = w.job, None
        if ok:
            job.future.set_result(value)
        else:
            job.future.set_exception(value)

    def _bury(self, w: _Worker) -> None:
        """Fail the call a dead worker held; the pool replaces it when a call needs it."""
        w.process.join()
        code = w.process.exitcode
        cause = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit {code}"
        with self._lock:
            self._workers.remove(w)
        w.conn.close()
        if w.job is not None:
            w.job.future.set_exception(
                WorkerDied(f"its worker process {w.process.pid} died ({cause})", w.process.pid)
            )
            w.job = None


@contextmanager
def worker_processes(n: int, stop: threading.Event | None = None) -> Iterator[None]:
    """Run :func:`run_in_worker` calls in up to ``n`` spawned processes while the block runs;
    once ``stop`` is set (within :data:`LINK_SECONDS`), their running calls see their stop
    event set, as on Ctrl-C."""
    global _POOL
    if _POOL is not None:
        raise RuntimeError("worker processes are already running in this process")
    _POOL = pool = _Pool(n, stop)
    try:
        yield
    except BaseException:
        pool.stop.set()
        raise
    finally:
        # Calls submitted while it shuts down fail with WorkerStopped instead of running here.
        pool.shutdown()
        _POOL = None


def worker_pool_active() -> bool:
    return _POOL is not None


def worker_pids() -> list[int]:
    """The pids of the running pool's live worker processes (empty without a pool)."""
    return _POOL.pids if _POOL is not None else []


def _unless_stopped(fn: Callable[..., T], *args: object) -> T:
    # A call dequeued after Ctrl-C must not start.
    if _WORKER_STOP is not None and _WORKER_STOP.is_set():
        raise WorkerStopped("interrupted before it started")
    return fn(*args)


def run_in_worker(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a worker process if a pool is running, else in the calling thread.

    Raises :class:`WorkerStopped` when the pool was stopped before the call started, and
    :class:`WorkerDied` when its worker process died while running it (the other workers and
    their calls go on; a new worker replaces the dead one).
    """
    pool = _POOL
    if pool is None:
        return fn(*args)
    future = pool.submit(fn, *args)
    try:
        return future.result()
    except CancelledError:
        raise WorkerStopped("interrupted before it started") from None
