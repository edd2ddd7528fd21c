"""Prefect runtime settings shared by every flow: local ephemeral mode, capped task runners.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server in a child process. Started as
Prefect does it, that child shares the terminal's process group: Ctrl-C stops it at the same
moment as the flow, which then cannot record its own end and hangs retrying the dead server; and
a ``kill -9`` of the flow leaves it listening. :func:`flow_settings` therefore has it started in
its own session (out of reach of the terminal's signals; Prefect stops it when the flow process
exits) under a guard that stops it as soon as its parent process is gone.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    PREFECT_HOME,
    get_current_settings,
    temporary_settings,
)
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.runtime._leftovers import SERVER_MARK
from tasks.config import RunConfig
from tasks.machine import exclusive

__all__ = [
    "flow_settings",
    "guarded_servers",
    "make_task_runner",
    "quiet_environment_faults",
    "server_log",
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


# The guarded server process: uvicorn in the main thread; a watcher thread stops it (SIGTERM, a
# clean shutdown) once the parent is gone, and ends the process for good 10 s later. Imports
# nothing of the platform, so it starts as fast as Prefect's own.
_GUARD = """
import os, signal, sys, threading, time
_, _mark, parent, log, *args = sys.argv
parent = int(parent)
try:  # the server's own errors go to a log file, not the terminal of the command
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
except OSError:
    pass

def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    os._exit(1)

threading.Thread(target=watch, daemon=True).start()
import uvicorn.main
sys.argv = ["uvicorn", *args]
uvicorn.main.main()
"""


def server_log() -> Path:
    """Where the temporary Prefect server's own output goes: ``$NLLAB_HOME/logs``. Its errors
    (a full disk, a request it failed) would otherwise flood the command's terminal."""
    from datasets import data_home

    folder = data_home() / "logs"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # the guard then leaves the output on the terminal
    return folder / "prefect-server.log"


#: The temporary server's port generator (seeded from the OS: see ``find_available_port``).
_PORTS = random.Random()
#: Ports tried in turn when another process's server answers on the one picked.
_START_ATTEMPTS = 5


def serves(pid: int, port: int | None) -> bool:
    """Whether process ``pid`` holds the socket listening on 127.0.0.1:``port`` (from Linux's
    ``/proc``; True where the socket table cannot be read: nothing to check against)."""
    want = f"0100007F:{port or 0:04X}"
    try:
        table = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    except OSError:
        return True
    listening = {f"socket:[{f[9]}]" for f in table if f[1] == want and f[3] == "0A"}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False  # the process is gone
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in listening:
                return True
        except OSError:
            continue  # closed meanwhile
    return False


class _GuardedServer(SubprocessASGIServer):
    """Prefect's temporary server, in its own session and stopped when its parent is gone."""

    def _run_uvicorn_command(self) -> subprocess.Popen:
        uvicorn = [
            "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--log-level", "error", "--lifespan", "on",
            # Stopped at exit: clients' idle keep-alive connections must not hold the exit up.
            "--timeout-graceful-shutdown", "1",
        ]  # fmt: skip
        env = {
            **os.environ,
            # as Prefect starts it: no UI, ephemeral mode
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            **get_current_settings().to_environment_variables(exclude_unset=True),
        }
        return subprocess.Popen(
            [sys.executable, "-c", _GUARD, SERVER_MARK, str(os.getpid()), str(server_log()),
             *uvicorn],
            env=env,
            start_new_session=True,
        )  # fmt: skip

    def find_available_port(self) -> int:
        # A generator of its own: Prefect draws from Python's global one, which any code of the
        # process may have seeded, and two processes seeded alike would pick the same ports.
        for _ in range(10):
            port = _PORTS.choice(self._port_range)
            if self.is_port_available(port):
                return port
        raise RuntimeError("Unable to find an available port after multiple attempts")

    def start(self, timeout: int | None = None) -> None:
        from flows.runtime.faults import EnvironmentFault

        # Servers of processes started together on one Prefect home would migrate its database
        # at the same time: one starts (and migrates) at a time.
        with exclusive(Path(PREFECT_HOME.value()).expanduser() / ".nllab-server-start.lock"):
            for _ in range(_START_ATTEMPTS):
                self._start_once(timeout)
                if self.server_process is None or serves(self.server_process.pid, self.port):
                    return
                # Another process's server answered on the port this one was to bind: never
                # use it (its flow runs would land in another home); start again elsewhere.
                self.server_process.terminate()
                self.server_process, self.running, self.port = None, False, None
        raise EnvironmentFault(
            f"Prefect's temporary server: {_START_ATTEMPTS} ports in a row answered with "
            "another process's server; run again, or start one server for both "
            "(`prefect server start`) and set PREFECT_API_URL"
        )

    def _start_once(self, timeout: int | None) -> None:
        from flows.runtime.faults import EnvironmentFault
        from flows.runtime.prefect_server import start_timeout_message, startup_timeout

        seconds = timeout or max(1, round(startup_timeout()))
        try:
            super().start(seconds)
        except RuntimeError as e:
            if "Timed out while attempting to connect" not in str(e):
                raise
            what = "Prefect's temporary server"
            raise EnvironmentFault(start_timeout_message(what, seconds)) from None

    def stop(self) -> None:
        # Ask it to stop, without waiting: it shuts down (gracefully, in its own session) while
        # this process exits, and its guard ends it for good should it linger.
        if self.server_process is not None and self.server_process.poll() is None:
            self.server_process.terminate()
        self.server_process = None
        super().stop()


def _guard_temporary_server() -> None:
    """Have Prefect's temporary server (if this process will need one) start guarded."""
    if PREFECT_API_URL.value():
        return  # a running server (or a test harness): nothing is started here
    # Prefect looks its temporary server up under the key None (as its own test harness does).
    if SubprocessASGIServer._instances.get(None) is None:
        _GuardedServer()


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
