"""What user code leaves behind when a command's work is done, and the process's end with it.

A plugin model or a simulator runs inside the command: a non-daemon thread it starts would hold
the interpreter's exit for ever (``threading._shutdown`` joins every such thread before the
``atexit`` handlers run), and a process it starts (``subprocess.Popen``) would outlive the
command, an orphan. When ``nllab`` is the program (not :func:`flows.cli.main` called by a test
or a script), :func:`end_with_work` ends both once the command has its exit code: the children
are stopped, lingering threads are abandoned (the process ends at once, saying so in one line),
and a stop signal during what remains of the exit ends it with ``128 + signal``, never 0.

:func:`adopt_orphans` makes the command the subreaper of its descendants (Linux ``prctl``
``PR_SET_CHILD_SUBREAPER``), so that a process started by a worker process that has ended since
is still the command's to stop, not an orphan of ``init``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from types import FrameType

__all__ = ["adopt_orphans", "end_children", "end_with_work", "lingering_threads"]

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
#: The argument that marks a guarded temporary Prefect server process (``ps`` shows it;
#: :mod:`flows.runtime._prefect` starts it): here, where the command's end is decided without
# Prefect.
SERVER_MARK = "nllab-prefect-server"
#: Seconds children get to end after SIGTERM before SIGKILL.
TERM_SECONDS = 2.0


def _own_marks() -> tuple[str, ...]:
    """Marks in the command lines of the descendants the command ends on its own path: the
    guarded temporary Prefect server (:data:`SERVER_MARK`; Prefect stops it at exit, after its
    last logs) and multiprocessing's resource tracker (it cleans up the workers' semaphores as
    it ends)."""
    return (SERVER_MARK, "multiprocessing.resource_tracker")


def adopt_orphans() -> None:
    """Make this process the subreaper of its descendants (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl: orphans of ended workers go to init, as before


def lingering_threads() -> list[threading.Thread]:
    """The non-daemon threads still alive besides this one: the interpreter's exit would wait
    for each."""
    here = threading.current_thread()
    return [t for t in threading.enumerate() if t is not here and not t.daemon and t.is_alive()]


def end_children() -> list[str]:
    """Stop this process's descendants (SIGTERM, then SIGKILL after :data:`TERM_SECONDS`), but
    those the command ends on its own path (:func:`_own_marks`); the command line of each."""
    import psutil

    marks = _own_marks()

    def ours(p: psutil.Process) -> bool:
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            return True  # gone, or a zombie: nothing to stop
        return any(mark in line for mark in marks)

    try:
        children = [p for p in psutil.Process().children(recursive=True) if not ours(p)]
    except psutil.Error:
        return []
    names = []
    for p in children:
        try:
            names.append(" ".join(p.cmdline())[:60])
            p.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(children, timeout=TERM_SECONDS)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return names


def _named(names: Iterable[str]) -> str:
    """``a, b ×3``: each name once, with its count when repeated."""
    return ", ".join(n if k == 1 else f"{n} ×{k}" for n, k in Counter(names).items())


def _exit_at_once(signum: int, _frame: FrameType | None) -> None:
    os._exit(128 + signum)


def end_with_work(command: str, code: int) -> int:
    """The command's work has ended with ``code``: stop the children user code left (one line
    naming them), and end the process now if threads it left would hold the exit (one line
    naming them; ``os._exit`` after the streams and log handlers are flushed). Otherwise return
    ``code`` for the normal exit, during which a stop signal exits ``128 + signal`` at once."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _exit_at_once)
    if stopped := end_children():
        print(
            f"nllab {command}: stopped {len(stopped)} process(es) that user code left running: "
            + _named(stopped),
            file=sys.stderr,
        )
    threads = lingering_threads()
    if not threads:
        return code
    time.sleep(0.1)  # one that was just ending
    if threads := lingering_threads():
        names = _named(repr(t.name) for t in threads)
        print(
            f"nllab {command}: done; {len(threads)} thread(s) that user code left running "
            f"would keep the process alive, abandoned: {names}",
            file=sys.stderr,
        )
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        logging.shutdown()
        os._exit(code)
    return code
