"""Prefect runtime settings shared by every flow: local ephemeral mode, capped task runners.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server in a child process. Started as
Prefect does it, that child shares the terminal's process group: Ctrl-C stops it at the same
moment as the flow, which then cannot record its own end and hangs retrying the dead server; and
a ``kill -9`` of the flow leaves it listening. :func:`flow_settings` therefore has it started in
its own session (out of reach of the terminal's signals; Prefect stops it when the flow process
exits) under a guard that stops it as soon as its parent process is gone
(:mod:`flows.runtime._temporary_server`, imported only where a server is started).
"""

from __future__ import annotations

import atexit
import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    temporary_settings,
)
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.runtime._leftovers import SERVER_MARK
from tasks.config import RunConfig

__all__ = [
    "flow_settings",
    "guarded_servers",
    "make_task_runner",
    "quiet_environment_faults",
]

# The interpreter's last full garbage collection at exit walks the whole heap that Prefect, MLflow
# and torch built (seconds on a busy machine, after Ctrl-C too); the OS frees it all anyway.
atexit.register(gc.freeze)


def guarded_servers(parent: int) -> list[int]:
    """Pids of the temporary Prefect servers that process ``parent`` started (from ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if SERVER_MARK.encode() in argv and str(parent).encode() in argv:
            found.append(int(entry.name))
    return found


def _guard_temporary_server() -> None:
    """Have Prefect's temporary server (if this process will need one) start guarded; the
    server's module (Prefect's whole API: seconds of CPU to import) is loaded only then."""
    if PREFECT_API_URL.value():
        return  # a running server (or a test harness): nothing is started here
    from prefect.server.api.server import SubprocessASGIServer

    from flows.runtime._temporary_server import GuardedServer

    # Prefect looks its temporary server up under the key None (as its own test harness does).
    if SubprocessASGIServer._instances.get(None) is None:
        GuardedServer()


#: Prefect's words for a flow or task run stopped by a signal (``exception_to_crashed_state``).
_SIGNAL_CRASHES = ("aborted by an interrupt signal", "aborted by a termination signal")


class _QuietEnvironmentFaults(logging.Filter):
    """Drops console records about a fault of the environment (a full disk, a server gone):
    ``nllab`` reports it once, in one line, and writes the traceback to a log file
    (:mod:`flows.runtime.faults`); Prefect would print one traceback per failed task and flow.

    Also drops Prefect's records of a pack task failed by its cells (``PackFailed``): each cell's
    traceback is in its run (``error.txt``) and the flow says which cell failed in one line;
    its "Crash detected!" records of a flow stopped by Ctrl-C or SIGTERM (its crash path,
    which the command reports as an interruption, in one line); and the first of its two
    records of a task that returned a ``Failed`` state (the second, "Finished in state
    Failed(...)", says why in one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from flows.runtime.faults import describe_fault, names_fault
        from tasks.prefect_tasks import PackFailed

        message = record.getMessage()
        if any(s in message for s in _SIGNAL_CRASHES):
            return False
        if message.startswith("Task run failed with state:"):
            return False  # a task's own Failed state (a data set that cannot be made): said next
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, PackFailed) or (
            record.name.startswith("prefect.task_runs") and "PackFailed" in record.getMessage()
        ):
            return False
        if error is not None and describe_fault(error) is not None:
            return False
        return not names_fault(record.getMessage())


_QUIET = _QuietEnvironmentFaults()


def quiet_environment_faults() -> None:
    """Put :class:`_QuietEnvironmentFaults` on the console handlers (idempotent)."""
    for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs", "mlflow"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and _QUIET not in handler.filters:
                handler.addFilter(_QUIET)


@contextmanager
def flow_settings() -> Iterator[None]:
    """Settings for a flow call: no heartbeat (it adds ~1 s per flow call on the local server),
    a temporary API server that survives the terminal's Ctrl-C and dies with this process, and
    no console tracebacks of environment faults (reported once by the command line)."""
    _guard_temporary_server()
    quiet_environment_faults()
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def make_task_runner(config: RunConfig) -> TaskRunner[Any]:
    """A task runner with at most ``config.execution.max_workers`` cells at once (a local Dask
    cluster: no more workers than the config has cells)."""
    if config.execution.task_runner == "dask":
        from flows.runtime._dask import dask_task_runner
        from tasks.tracking import TrackingSettings

        return dask_task_runner(
            min(config.execution.max_workers, len(config.cells())),
            config.execution.dask_address,
            TrackingSettings.resolve(config.tracking),
        )
    return ThreadPoolTaskRunner(max_workers=config.execution.max_workers)
