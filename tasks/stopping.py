"""One way to stop a command: Ctrl-C (SIGINT) and SIGTERM (how schedulers, ``timeout``, systemd
and CI stop a job) both raise :class:`Stopped` in the main thread, so that a terminated command
ends as an interrupted one does: running cells stop at their next batch and end KILLED
(the engine sets ``CellRuntime.stop``), finished ones are kept, one line, exit ``128 + signal``
(130, 143).

Also what tells a real interruption from user code that raises ``KeyboardInterrupt`` or calls
``sys.exit`` (:func:`from_signal`, :func:`user_exit`): a signal is delivered to the main thread
only (Python's ``signal`` module, "Signals and threads"), and under :func:`stop_signals` every
signal raises :class:`Stopped`, never a bare ``KeyboardInterrupt``.

Standard library only: the command line installs it before anything heavy loads.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import TypeVar

from tasks.errors import Interrupted

__all__ = [
    "ABANDON_SECONDS",
    "STOP_SIGNALS",
    "Stopped",
    "UserCodeExit",
    "abandonable",
    "contained",
    "from_signal",
    "hold_stop",
    "raiser",
    "release_stop",
    "stop_signals",
    "user_exit",
]

T = TypeVar("T")

#: The signals that stop a command as Ctrl-C does.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """A stop signal received by the main thread; ``exit_code`` is ``128 + signal``, as a shell
    reports a process the signal ended."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum

    def __reduce__(self):
        return type(self), (self.signum,)


#: Seconds the work may take to stop after a stop signal (running cells end KILLED at their
#: next batch) before what still runs (user code that hangs) is abandoned.
ABANDON_SECONDS = 30.0


class _Abandon:
    """What the process does when work does not stop after a signal: ``exit(code)`` is called
    from a watchdog thread :data:`ABANDON_SECONDS` after the first signal, or at once on a
    second one (the user insists)."""

    def __init__(self) -> None:
        self.exit: Callable[[int], None] | None = None
        self.first: Stopped | None = None
        self.timer: threading.Timer | None = None

    def signalled(self, signum: int) -> Stopped:
        stopped = Stopped(signum)
        if self.exit is None:
            return stopped
        if self.first is not None:
            self.exit(self.first.exit_code)
        self.first = stopped
        self.timer = threading.Timer(ABANDON_SECONDS, self.exit, (stopped.exit_code,))
        self.timer.daemon = True
        self.timer.name = "nllab-abandon"
        self.timer.start()
        return stopped

    def arm(self, exit: Callable[[int], None]) -> None:
        self.exit, self.first, self.timer = exit, None, None

    def disarm(self, stopping: bool) -> None:
        """The outermost block ended: the watchdog keeps watching only if the process is
        going down after a signal (its exit may hang joining a stuck thread)."""
        if self.timer is not None and not stopping:
            self.timer.cancel()
        self.exit = None


_ABANDON = _Abandon()


class _Held:
    """A stop signal received while the main thread holds stop signals back: raised when the
    hold ends (:func:`release_stop`)."""

    def __init__(self) -> None:
        self.holding = False
        self.pending: Stopped | None = None


_HELD = _Held()


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    stopped = _ABANDON.signalled(signum)  # the watchdog runs (and a second signal ends) as ever
    if _HELD.holding:
        _HELD.pending = _HELD.pending or stopped
        return
    raise stopped


def hold_stop() -> bool:
    """In the main thread, hold stop signals back until :func:`release_stop`: a step that
    must not be cut in two (a record created and then marked as this process's) cannot be
    split by Ctrl-C or SIGTERM. Whether it holds (not in another thread, nor when already
    held). The watchdog of :func:`stop_signals` still abandons work that never releases."""
    if threading.current_thread() is not threading.main_thread() or _HELD.holding:
        return False
    _HELD.holding, _HELD.pending = True, None
    return True


def release_stop() -> None:
    """End the main thread's hold (:func:`hold_stop`; nothing in another thread or without a
    hold): a stop signal received meanwhile is raised here, as :class:`Stopped`."""
    if threading.current_thread() is not threading.main_thread() or not _HELD.holding:
        return
    pending, _HELD.holding, _HELD.pending = _HELD.pending, False, None
    if pending is not None:
        raise pending


@contextmanager
def stop_signals(abandon: Callable[[int], None] | None = None) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Stopped` in the main thread (a signal
    ignored when the block starts, as ``nohup`` or a background job leaves it, stays ignored).
    Re-entering it re-arms the handlers (Prefect's flow engine installs its own SIGTERM
    handler, whose crash path would print "Crash detected!"); outside the main thread nothing
    changes.

    ``abandon(exit_code)`` (the outermost block's): called when the work has not stopped
    :data:`ABANDON_SECONDS` after a signal, or on a second signal; it must end the process
    (``os._exit``), since a thread stuck in user code can be neither stopped nor joined."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if abandon is not None:
        _ABANDON.arm(abandon)
    previous = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _raise_stopped)
    stopping = False
    try:
        yield
    except Stopped:
        stopping = True
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if abandon is not None:
            _ABANDON.disarm(stopping)


def from_signal(error: BaseException) -> bool:
    """Whether the ``KeyboardInterrupt`` ``error`` came from a signal, not from code that raised
    it: a :class:`Stopped`, or a bare one in the main thread while :func:`stop_signals` is not
    in force (then it cannot be told, and Ctrl-C wins)."""
    if isinstance(error, Stopped):
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    # SIG_IGN: no Ctrl-C reaches this process (a worker process, a background job)
    return signal.getsignal(signal.SIGINT) not in (_raise_stopped, signal.SIG_IGN)


def raiser(tb: TracebackType | None) -> str:
    """``module:function`` of the innermost frame of ``tb`` (where an exception was raised, or
    which called ``sys.exit``), or ``?``."""
    frame = None
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{frame.f_globals.get('__name__', '?')}:{getattr(code, 'co_qualname', code.co_name)}"


def user_exit(error: BaseException) -> str | None:
    """One line when ``error`` is user code leaving by ``sys.exit`` or by a ``KeyboardInterrupt``
    no signal caused (:func:`from_signal`), naming the function; ``None`` otherwise."""
    if isinstance(error, SystemExit):
        return f"{raiser(error.__traceback__)} called sys.exit({error.code!r})"
    if isinstance(error, KeyboardInterrupt) and not from_signal(error):
        return f"{raiser(error.__traceback__)} raised KeyboardInterrupt (no Ctrl-C was pressed)"
    return None


class UserCodeExit(RuntimeError):
    """User code (a simulator, a plugin model) called ``sys.exit`` or raised a
    ``KeyboardInterrupt`` of its own: its data set or cell fails with this one line, and the
    command goes on (it must never end the command, let alone with exit code 0)."""


@contextmanager
def contained() -> Iterator[None]:
    """Around calls into user code: its ``sys.exit`` and stray ``KeyboardInterrupt``
    (:func:`user_exit`) become :class:`UserCodeExit`; a real stop signal propagates."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt) as e:
        if (line := user_exit(e)) is None:
            raise
        raise UserCodeExit(line) from e


def abandonable(fn: Callable[[], T], stop: threading.Event | None, what: str) -> T:
    """``fn()`` (under :func:`contained`) in a daemon thread, its value or error; once ``stop``
    is set, :class:`~tasks.errors.Interrupted` at once, leaving ``fn`` to run on, abandoned
    (a daemon thread never holds up the process's exit). For user code that may hang, where
    no signal reaches it (a signal reaches the main thread only). ``stop=None``: ``fn()`` here."""
    if stop is None:
        with contained():
            return fn()
    box: list = []
    done = threading.Event()

    def target() -> None:
        try:
            with contained():
                box.append((True, fn()))
        except BaseException as e:  # handed to the caller's thread
            box.append((False, e))
        finally:
            done.set()

    threading.Thread(target=target, name=f"nllab {what}", daemon=True).start()
    while not done.wait(0.2):
        if stop.is_set():
            raise Interrupted(f"{what}: interrupted (abandoned while it ran)")
    ok, value = box[0]
    if not ok:
        raise value
    return value
