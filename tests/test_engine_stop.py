"""The engine's one stop path reaches cells in worker processes: a caller's stop event (a
deadline's) is passed on to the workers' own, as Ctrl-C's is."""

from __future__ import annotations

import os
import threading
import time


def _wait_for_stop(seconds: float) -> bool:
    """In a worker: whether its stop event is set within ``seconds``."""
    from tasks._workers import worker_stop_event

    event = worker_stop_event()
    return event is not None and event.wait(seconds)


def test_a_callers_stop_event_reaches_a_running_call_in_a_worker_process():
    from tasks._workers import LINK_SECONDS, run_in_worker, worker_processes

    stop = threading.Event()
    with worker_processes(1, stop):
        assert run_in_worker(os.getpid) != os.getpid()  # the worker is up
        timer = threading.Timer(0.5, stop.set)
        timer.start()
        t0 = time.monotonic()
        assert run_in_worker(_wait_for_stop, 60.0) is True
        assert time.monotonic() - t0 < 0.5 + LINK_SECONDS + 5
    timer.join()
