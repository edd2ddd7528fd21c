"""Which host and process own a run or a claim, and whether that process still lives.

Standard library only. A run records its host and process (tags ``nllab.host`` and
``nllab.process``); a claim names its owner the same way (:func:`claim_owner`), so a later
start can tell a run or claim of a process that has ended from one of a live process.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = [
    "claim_owner",
    "host_id",
    "owner_gone",
    "process_alive",
    "process_token",
    "stat_fields",
]


def host_id() -> str:
    """This host, as pids are meaningful: the host name and (on Linux) the pid namespace, so
    two containers with one host name never judge each other's processes."""
    try:
        ns = os.readlink("/proc/self/ns/pid").removeprefix("pid:")
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()}{ns}"


def process_token(pid: int) -> str | None:
    """``PID:START`` of a live process on this host (START: its start time in clock ticks since
    boot, from ``/proc``, so a recycled pid does not pass as the old process), or ``None``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by someone else
    fields = stat_fields(pid)
    if fields is None:
        return str(pid)  # no /proc (not Linux): the pid alone
    return f"{pid}:{fields[19]}"  # field 22 of proc(5): starttime


def stat_fields(pid: int, proc: Path = Path("/proc")) -> list[str] | None:
    """The fields of ``proc/<pid>/stat`` after the command name (``fields[0]`` is proc(5)'s
    field 3, the state), or ``None`` where it is gone or unreadable. The name (field 2) may
    hold spaces and brackets, so the split is after its last ``)``."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def process_alive(token: str) -> bool:
    """Whether the process of ``token`` (from :func:`process_token`) is alive on this host."""
    pid = token.split(":", 1)[0]
    if not pid.isdigit():
        return True  # not ours to judge
    current = process_token(int(pid))
    if current is None:
        return False
    return ":" not in token or ":" not in current or current == token


def claim_owner() -> str:
    """A claim owner naming this process: ``HOST/PID:START/RANDOM`` (unique per call)."""
    token = process_token(os.getpid()) or str(os.getpid())
    return f"{host_id()}/{token}/{os.urandom(4).hex()}"


def owner_gone(owner: str) -> bool:
    """Whether ``owner`` (from :func:`claim_owner`) is a process of this host that has ended."""
    parts = owner.split("/")
    return len(parts) == 3 and parts[0] == host_id() and not process_alive(parts[1])
