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

__all__ = ["ServerMissing", "api_url", "healthy", "require_server", "start_server"]


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


def start_server(port: int = 4200, timeout: float = 90.0) -> tuple[subprocess.Popen, str]:
    """Start ``prefect server start`` on 127.0.0.1:``port``; returns the process and API URL."""
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
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerMissing(f"`prefect server start` exited with code {proc.returncode}")
        if healthy(api):
            return proc, api
        time.sleep(1.0)
    proc.terminate()
    raise ServerMissing(f"the Prefect server did not answer on {api} within {timeout:.0f} s")
