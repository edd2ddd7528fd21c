"""The Prefect server that ``nllab serve`` schedules on: found through ``PREFECT_API_URL``,
started for the lifetime of a command (``--start-server``), or explained how to start.

Schedules need a real server: the temporary one that flows start on their own cannot schedule
("Cannot schedule flows on an ephemeral server").
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from flows.runtime.faults import EnvironmentFault

__all__ = [
    "ServerMissing",
    "api_url",
    "healthy",
    "require_answer",
    "require_server",
    "start_server",
    "start_timeout_message",
    "startup_timeout",
]


class ServerMissing(RuntimeError):
    """No Prefect server to schedule on; the message says how to start one."""


def api_url() -> str | None:
    """The configured Prefect API (``PREFECT_API_URL``), or ``None``."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def require_server(api: str | None) -> str:
    """``api`` if set, else :class:`ServerMissing` saying how to start a server."""
    if api:
        return api
    raise ServerMissing(
        "schedules need a Prefect server; the temporary one that flows start on their own "
        "cannot schedule. Either\n"
        "  1. start one (offline; UI on http://127.0.0.1:4200):\n"
        "       prefect server start --host 127.0.0.1 --port 4200\n"
        "     then, in this shell:\n"
        "       export PREFECT_API_URL=http://127.0.0.1:4200/api\n"
        "       nllab serve\n"
        "  2. or let this command start one for as long as it runs:\n"
        "       nllab serve --start-server"
    )


def healthy(api: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``api`` answers its health check within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(f"{api.rstrip('/')}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def require_answer(api: str) -> None:
    """:class:`~flows.runtime.faults.EnvironmentFault` (exit 3) when nothing answers at ``api``."""
    if not healthy(api, timeout=10.0):
        raise EnvironmentFault(
            f"no Prefect server answers at {api} (PREFECT_API_URL): start it "
            "(`prefect server start`), or unset PREFECT_API_URL and use --start-server"
        )


def start_server(port: int = 4200, timeout: float | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``prefect server start`` on 127.0.0.1:``port``; returns the process and API URL.

    The server runs in its own session: the terminal's Ctrl-C stops ``nllab serve``, which
    pauses its deployments on the server and only then stops it. ``timeout`` (default
    :func:`startup_timeout`) elapsed or the server gone:
    :class:`~flows.runtime.faults.EnvironmentFault`.
    """
    timeout = startup_timeout() if timeout is None else timeout
    api = f"http://127.0.0.1:{port}/api"
    if healthy(api):
        raise ServerMissing(f"a server already answers on {api}: export PREFECT_API_URL={api}")
    exe = Path(sys.executable).with_name("prefect")
    cmd = [str(exe) if exe.exists() else "prefect", "server", "start"]
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EnvironmentFault(
                    f"`prefect server start` exited with code {proc.returncode} before "
                    f"answering on {api}; run it by hand to see why"
                )
            if healthy(api):
                return proc, api
            time.sleep(1.0)
    except BaseException:  # Ctrl-C while waiting too: the server is in its own session
        proc.terminate()
        raise
    proc.terminate()
    raise EnvironmentFault(start_timeout_message(f"the Prefect server on {api}", timeout))


#: Seconds a Prefect server gets to start on an idle machine; more per unit of load per core.
STARTUP_SECONDS, STARTUP_SECONDS_PER_LOAD = 90, 60


def startup_timeout() -> float:
    """Seconds to wait for a Prefect server to answer: ``PREFECT_SERVER_EPHEMERAL_STARTUP_
    TIMEOUT_SECONDS`` when set, else :data:`STARTUP_SECONDS` plus
    :data:`STARTUP_SECONDS_PER_LOAD` for each unit of 1-minute load per core over 1 (a loaded
    machine starts the server's Python, database migration and uvicorn several times slower)."""
    try:
        return float(os.environ[TIMEOUT_VARIABLE])
    except (KeyError, ValueError):
        pass
    try:
        excess = max(0.0, os.getloadavg()[0] / (os.cpu_count() or 1) - 1.0)
    except OSError:
        excess = 0.0
    return float(min(600, round(STARTUP_SECONDS + STARTUP_SECONDS_PER_LOAD * excess)))


#: The Prefect setting of how long its temporary server gets to start (the user's knob).
TIMEOUT_VARIABLE = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


def start_timeout_message(what: str, timeout: float) -> str:
    """One line: ``what`` did not start within ``timeout`` seconds, and how to give it longer."""
    try:
        load = f" (1-minute load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    except OSError:
        load = ""
    return (
        f"{what} did not start within {timeout:.0f} s{load}; give it longer with "
        f"{TIMEOUT_VARIABLE}=SECONDS, or run again when the machine is less busy"
    )
