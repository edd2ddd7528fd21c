"""The engine's seams for callers: its cell-finished hook (called per pack, its failure logged
and never fatal), and its one stop path reaching cells in worker processes (a caller's stop
event, a deadline's, is passed on to the workers' own, as Ctrl-C's is)."""

from __future__ import annotations

import os
import threading
import time


def _wait_for_stop(seconds: float) -> bool:
    """In a worker: whether its stop event is set within ``seconds``."""
    from tasks.machine.workers import worker_stop_event

    event = worker_stop_event()
    return event is not None and event.wait(seconds)


def test_a_callers_stop_event_reaches_a_running_call_in_a_worker_process():
    from tasks.machine.workers import run_in_worker, worker_processes

    stop = threading.Event()
    with worker_processes(1, stop):
        assert run_in_worker(os.getpid) != os.getpid()  # the worker is up
        timer = threading.Timer(0.5, stop.set)
        timer.start()
        t0 = time.monotonic()
        assert run_in_worker(_wait_for_stop, 120.0) is True  # the event, not the wait's end
        # passed on within LINK_SECONDS of the timer; the bound is against the worker's own
        # 120 s wait, not a few seconds a loaded machine's scheduling can use up
        assert time.monotonic() - t0 < 60
    timer.join()


def test_the_cell_finished_hook_sees_each_pack_and_its_failure_is_not_fatal(
    mlflow_store, prefect_server, caplog
):
    from flows.benchmark import run_benchmark
    from tasks.config import resolve_config

    config = resolve_config(
        "smoke",
        overrides={
            "systems": ["integro_de", "piecewise_forcing_ode"],
            "methods": ["node"],
            "seeds": [0],
            "isolation": "thread",
            "max_workers": 1,
            "pack": False,
            "progress": False,
            "training": {"epochs": 2},
        },
    )
    seen: list[list[str]] = []

    def hook(results) -> None:
        seen.append([r.key for r in results])
        raise RuntimeError("the hook breaks")

    summary = run_benchmark(config, on_finished=hook)
    assert summary.ok and sorted(k for keys in seen for k in keys) == sorted(
        r.key for r in summary.results
    )
    assert len(seen) == 2  # one call per pack (packing off: a pack per cell)
    assert "the cell-finished hook failed for" in caplog.text and "the hook breaks" in caplog.text
