"""Low CPU priority that holds against other sessions' work, not only against this terminal's.

``nice`` orders processes only within their scheduling group. On Linux with autogroup
scheduling (``/proc/sys/kernel/sched_autogroup_enabled``, on by default in the common
distribution kernels) each session is a group of its own, and the groups share the CPU as
equals (sched(7), "The autogroup feature"): a run at nice 19 started in its own session
(``setsid``, ``nohup`` from a script, a tmux window, cron) takes half of a busy two-core
machine from a test suite in another terminal. The group's own nice
(``/proc/<pid>/autogroup``) is what ranks the groups, so :func:`lower_priority` raises it too,
where the session holds nothing but this process, its children and the processes that
started it (a launching shell waiting for it): in a terminal where other jobs run it leaves
the group alone, since that would lower them as well.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PriorityChange", "lower_priority", "lower_session_group"]

PROC = Path("/proc")


@dataclass(frozen=True)
class PriorityChange:
    """What :func:`lower_priority` did: ``nice`` the process's niceness after it; ``group``
    ``"raised"`` (the session's autogroup niceness raised to ``group_nice``), ``"shared"``
    (left: other processes share the session), or ``"none"`` (no autogroup scheduling here)."""

    nice: int
    group: str
    group_nice: int | None = None

    def hint(self) -> str | None:
        """A line for the user where other sessions still compete as equals."""
        if self.group != "shared":
            return None
        return (
            "note: this session runs other processes, so its scheduling group keeps its "
            "priority (Linux autogroup): other sessions' work shares the CPU with this run as "
            "an equal; start it in a session of its own (setsid) to make it yield"
        )


def _stat(proc: Path, pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) of ``pid``, or None if it is gone or unreadable."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and brackets
    return int(fields[1]), int(fields[3])


def _lineage(proc: Path, pid: int) -> set[int]:
    """``pid`` and its ancestors."""
    seen: set[int] = set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        stat = _stat(proc, pid)
        if stat is None:
            break
        pid = stat[0]
    return seen


def _alone_in_session(proc: Path, pid: int) -> bool:
    """Whether ``pid``'s session holds only ``pid``, its ancestors and its descendants."""
    own = _stat(proc, pid)
    if own is None:
        return False
    session, mine = own[1], _lineage(proc, pid)
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        stat = _stat(proc, int(entry.name))
        if stat is not None and stat[1] == session and pid not in _lineage(proc, int(entry.name)):
            return False
    return True


def _raise_group(proc: Path, pid: int, nice: int) -> int | None:
    """Raise ``pid``'s autogroup niceness by ``nice`` (at most 19); the new value, or None
    where the file refuses."""
    try:
        path = proc / str(pid) / "autogroup"
        current = int(path.read_text().split("nice")[1])
        target = min(19, current + nice)
        if target > current:
            path.write_text(f"{target}\n")
        return target
    except (OSError, ValueError, IndexError):
        return None


def lower_session_group(nice: int, *, proc: Path = PROC, pid: int | None = None) -> PriorityChange:
    """Where Linux ranks sessions by autogroup and ``pid``'s session (default: this process's)
    holds only it, its ancestors and its descendants, add ``nice`` to the session group's
    niceness (see the module's docstring); ``proc``: another process table (tests). The
    returned ``nice`` is the process's own, unchanged here."""
    own = os.getpid() if pid is None else pid
    try:
        enabled = (proc / "sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
        current = os.getpriority(os.PRIO_PROCESS, 0) if pid is None else 0
    except OSError:
        enabled, current = False, 0
    if not enabled or nice <= 0 or not (proc / str(own) / "autogroup").exists():
        return PriorityChange(current, "none")
    if not _alone_in_session(proc, own):
        return PriorityChange(current, "shared")
    group = _raise_group(proc, own, nice)
    return PriorityChange(current, "none" if group is None else "raised", group)


def lower_priority(nice: int) -> PriorityChange:
    """Add ``nice`` to this process's niceness (its workers inherit it) and, where that alone
    would not make it yield to other sessions, to its session group's
    (:func:`lower_session_group`)."""
    value = os.nice(nice)
    change = lower_session_group(nice)
    return PriorityChange(value, change.group, change.group_nice)
