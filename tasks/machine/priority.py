"""Low CPU priority that holds against other sessions' work, not only against this terminal's.

``nice`` orders processes only within their scheduling group. On Linux with autogroup
scheduling (``/proc/sys/kernel/sched_autogroup_enabled``, on by default in the common
distribution kernels) each session is a group of its own, and the groups share the CPU as
equals (sched(7), "The autogroup feature"): a run at nice 19 started in its own session
(``setsid``, a tmux window, cron, a systemd unit) takes half of a busy two-core machine from
a test suite in another terminal. The group's own nice
(``/proc/<pid>/autogroup``) is what ranks the groups, so :func:`lower_priority` raises it too,
where the session holds nothing but this process, its children and the processes that
started it (a launching shell waiting for it): in a terminal where other jobs run it leaves
the group alone, since that would lower them as well. The group outlives the run where the
session does (a terminal's shell), so :meth:`PriorityChange.restore` puts its niceness back.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from tasks.tracking.processes import stat_fields

__all__ = ["PriorityChange", "lower_priority", "lower_session_group"]

PROC = Path("/proc")


@dataclass(frozen=True)
class PriorityChange:
    """What :func:`lower_priority` did: ``nice`` the process's niceness after it; ``group``
    ``"raised"`` (the session's autogroup niceness raised to ``group_nice``), ``"shared"``
    (left: other processes share the session), or ``"none"`` (no autogroup scheduling here);
    ``group_before`` the group's niceness before."""

    nice: int
    group: str
    group_nice: int | None = None
    group_before: int | None = None
    #: the autogroup file changed (None where none was)
    group_file: Path | None = None
    #: the process's own niceness before (None: not changed by :func:`lower_priority`)
    nice_before: int | None = None

    def restore(self) -> None:
        """Put the process's niceness back where the system allows it (lowering it needs
        privileges: a run started from Python, ``flows.cli.main``, would otherwise leave its
        caller niced), and the session group's (a lower value than now is allowed where it is
        not negative), unless somebody has changed it since; nothing where none was raised."""
        if self.nice_before is not None and os.getpriority(os.PRIO_PROCESS, 0) == self.nice:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self.nice_before)
            except OSError:
                pass  # an unprivileged process cannot lower its niceness again
        if self.group_file is None or self.group_before is None:
            return
        if _group_nice(self.group_file) == self.group_nice:
            try:
                self.group_file.write_text(f"{self.group_before}\n")
            except OSError:
                pass

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
    fields = stat_fields(pid, proc)
    return None if fields is None else (int(fields[1]), int(fields[3]))


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


def _group_nice(path: Path) -> int | None:
    """The niceness in an autogroup file (``/autogroup-25 nice 0``: its last word), or None
    where it is unreadable or empty: the kernel leaves it empty for a process of the default
    group (its session never left init's, as in many containers), whose processes compete one
    by one with the other sessions' groups, so that their own niceness already ranks them."""
    try:
        return int(path.read_text().split()[-1])
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
    path = proc / str(own) / "autogroup"
    before = _group_nice(path) if enabled and nice > 0 else None
    if before is None:
        return PriorityChange(current, "none")
    if not _alone_in_session(proc, own):
        return PriorityChange(current, "shared")
    target = min(19, before + nice)  # the kernel refuses more than 19
    if target > before:
        try:
            path.write_text(f"{target}\n")
        except OSError:
            return PriorityChange(current, "none")
    return PriorityChange(current, "raised", target, before, path)


def lower_priority(nice: int) -> PriorityChange:
    """Add ``nice`` to this process's niceness (its workers inherit it) and, where that alone
    would not make it yield to other sessions, to its session group's
    (:func:`lower_session_group`); :meth:`PriorityChange.restore` puts both back."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    value = os.nice(nice)
    return dataclasses.replace(lower_session_group(nice), nice=value, nice_before=before)
