"""Prefect's temporary API server as ``nllab`` starts it (:class:`GuardedServer`): in its own
session, out of reach of the terminal's Ctrl-C, stopped by a guard as soon as the process that
started it is gone, on a port of its own (:mod:`flows.runtime._prefect` says why).

Imported only by a process that starts one: this module loads Prefect's whole API
(``prefect.server.api.server``), which a process with ``PREFECT_API_URL`` never needs.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_HOME, get_current_settings

from flows.runtime._leftovers import SERVER_MARK
from tasks.machine import exclusive

__all__ = ["GuardedServer", "server_log", "serves"]


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


class GuardedServer(SubprocessASGIServer):
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
