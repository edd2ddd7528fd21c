"""What a run shows while its packs train (:func:`tasks.engine.run_cells`): in a terminal, a
bar of cells; redirected (a log file, CI), one line per finished cell and a heartbeat line in
long silences, so that a long phase visibly moves."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from tqdm.auto import tqdm

from tasks.reports import number, plural
from tasks.results import CellResult

__all__ = ["HEARTBEAT_SECONDS", "Display", "Heartbeat", "clock", "print_finished"]

#: Seconds of silence after which a redirected run prints a line saying it is still working
#: (``NLLAB_HEARTBEAT_SECONDS`` changes it).
HEARTBEAT_SECONDS = float(os.environ.get("NLLAB_HEARTBEAT_SECONDS", "60"))


class Heartbeat:
    """Prints ``status()`` whenever :data:`HEARTBEAT_SECONDS` pass without a line, from a
    background thread between :meth:`start` and :meth:`stop` (redirected output, which has no
    progress bars to show that a long phase is still moving)."""

    def __init__(self, enabled: bool, status: Callable[[], str]) -> None:
        self.enabled, self.status = enabled, status
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="nllab-heartbeat", daemon=True)

    def printed(self) -> None:
        """A line was printed: the silence starts again."""
        self.last = time.monotonic()

    def _beat(self) -> None:
        while not self._stop.wait(min(HEARTBEAT_SECONDS, 5.0)):
            if time.monotonic() - self.last >= HEARTBEAT_SECONDS:
                print(self.status(), flush=True)
                self.printed()

    def start(self) -> None:
        if self.enabled:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def clock(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def print_finished(done: Sequence[CellResult], n: int, total: int, seconds: float) -> None:
    """One line per finished cell (progress when the output is not a terminal): its own
    training seconds, and the time since the first pack started."""
    for i, r in enumerate(done, start=n - len(done) + 1):
        outcome = (
            f"test RMSE {number(r.test_rmse)}"
            if r.ok
            else f"{r.status}: {(r.error or 'no result').splitlines()[0]}"
        )
        trained = f"trained {r.train_seconds:.0f} s, " if r.train_seconds is not None else ""
        print(
            f"cell {i}/{total} {r.key}: {outcome} ({trained}{clock(seconds)} since training "
            "started)",
            flush=True,
        )


class Display:
    """What a run shows while its packs train: in a terminal, a bar of cells; redirected, one
    line per finished cell (:func:`print_finished`) and a heartbeat in long silences. Before
    training starts (the data sets simulating: a simulator may take long, or hang) the
    heartbeat speaks in a terminal too, where no bar shows yet."""

    def __init__(self, progress: bool, todo: int, reused: int) -> None:
        # Bars redraw in place: in a terminal only. Redirected, a line per finished cell instead.
        self.lines = progress and not (sys.stdout.isatty() and sys.stderr.isatty())
        self.bars, self.todo, self.reused = progress and not self.lines, todo, reused
        self.t0, self.finished, self.training = time.perf_counter(), 0, False
        self.heartbeat = Heartbeat(progress, self.status)
        self.bar: tqdm | None = None

    def status(self) -> str:
        if not self.training:
            return f"… simulating data sets ({clock(time.perf_counter() - self.t0)})"
        return (
            f"… {self.finished}/{plural(self.todo, 'cell')} finished, "
            f"{clock(time.perf_counter() - self.t0)} since training started"
        )

    def __enter__(self) -> Display:
        self.heartbeat.start()
        return self

    def training_started(self) -> None:
        self.heartbeat.printed()
        if self.bars:  # the bar shows the run moving from now on
            self.heartbeat.stop()
        self.t0, self.training = time.perf_counter(), True
        bars = {"desc": "cells", "unit": "cell", "position": 0, "leave": True}
        self.bar = tqdm(total=self.todo, disable=not self.bars, **bars)

    def pack_finished(self, done: list[CellResult], results: Iterable[CellResult]) -> None:
        assert self.bar is not None
        self.bar.update(len(done))
        self.finished += len(done)
        seconds = time.perf_counter() - self.t0
        if self.lines:
            print_finished(done, self.finished, self.todo, seconds)
            self.heartbeat.printed()
        failed = sum(not r.ok for r in results)
        self.bar.set_postfix(failed=failed, reused=self.reused, elapsed=f"{seconds:.0f}s")

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
        self.heartbeat.stop()
