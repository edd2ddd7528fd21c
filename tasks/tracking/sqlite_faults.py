"""What an sqlite store's error means to its user, in one line each: busy (held by another
process: which one), read-only, full, damaged, or at a path longer than sqlite opens.

Only the standard library loads here: :mod:`flows.runtime.faults` classifies any error the platform
meets with it, and the tracking store explains a failed open with it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["MAX_SQLITE_PATH", "lock_holders", "path_too_long", "sqlite_problem"]

#: The longest path sqlite's unix VFS opens (``MAX_PATHNAME``, 512); ``-journal`` and ``-wal``
#: files add 8 characters to the store's own name.
MAX_SQLITE_PATH = 512 - len("-journal") - 1

_LOCKED = ("database is locked", "database table is locked")
_READ_ONLY = ("attempt to write a readonly database", "readonly database")
_FULL = ("database or disk is full", "no space left on device", "disk quota exceeded")
_DAMAGED = ("database disk image is malformed", "file is not a database", "file is encrypted")
_CANNOT_OPEN = ("unable to open database file",)


def lock_holders(path: Path) -> list[str]:
    """``pid N (command)`` of each other process holding a POSIX lock on ``path`` (Linux's
    ``/proc/locks``: sqlite locks its file with ``fcntl``); empty when none is seen."""
    try:
        st = path.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return []
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[5] == where and fields[4].isdigit():
            pid = int(fields[4])
            if pid != os.getpid() and pid not in pids:
                pids.append(pid)
    out = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            command = " ".join(" ".join(a.decode(errors="replace") for a in argv).split())[:80]
        except OSError:
            command = "?"
        out.append(f"pid {pid} ({command})")
    return out


def _writable(path: Path) -> bool | None:
    """Whether ``path`` opens for writing (``None``: it cannot be told, e.g. it is gone)."""
    try:
        os.close(os.open(path, os.O_RDWR))
    except (PermissionError, IsADirectoryError):
        return False
    except OSError as e:
        return False if e.errno == 30 else None  # EROFS: a read-only file system
    return True


def _folder_writable(folder: Path) -> bool | None:
    """Whether a file can be created in ``folder`` (sqlite's journal must be), ``None`` when
    the folder is missing or not searchable."""
    if not folder.is_dir() or not os.access(folder, os.X_OK):
        return None
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False  # a permission, an immutable flag (chattr +i), a read-only file system
    return True


def path_too_long(path: Path) -> str | None:
    """One line when sqlite cannot open a store at ``path`` for its length, else ``None``."""
    n = len(str(path.expanduser().absolute()))
    if n <= MAX_SQLITE_PATH:
        return None
    return (
        f"the store path {str(path)[:60]}... is {n} characters long; sqlite opens at most "
        f"{MAX_SQLITE_PATH}: set NLLAB_HOME to a shorter folder"
    )


def sqlite_problem(text: str, path: Path, what: str = "the MLflow store") -> str | None:
    """One line for the sqlite error ``text`` of the store at ``path``, or ``None`` when the
    text names none of busy, read-only, full, damaged or unopenable."""
    low = text.lower()
    if any(m in low for m in _LOCKED):
        held = lock_holders(path)
        by = f"held by {', '.join(held)}" if held else "held by another process"
        return (
            f"{what} {path} is busy ({by}; a process stopped with Ctrl-Z holds it until resumed "
            "with `fg`); nothing was lost: run the command again once it is free"
        )
    if "disk i/o error" in low and _writable(path) is False:
        low = "readonly database"  # an immutable file (chattr +i) fails its writes as I/O
    if any(m in low for m in _CANNOT_OPEN) and _folder_writable(path.parent) is False:
        low = "readonly database"  # its journal cannot be created beside it
    if any(m in low for m in _READ_ONLY):
        return (
            f"{what} {path} is read-only (a permission or an immutable flag on it or its folder: "
            f"check `ls -l {path}` and `lsattr {path}`, `lsattr -d {path.parent}`); make it "
            "writable and run the command again: nothing needs to move"
        )
    if any(m in low for m in _FULL):
        return (
            f"the disk of {what} {path} is full: free some space, then run the same command "
            "again (finished work is kept)"
        )
    if damage := next((m for m in _DAMAGED if m in low), None):
        return (
            f"{what} {path} is damaged (sqlite: {damage}); move it aside "
            f"(mv {path} {path}.broken) and run the command again: a new, empty store is made "
            f"(`sqlite3 {path}.broken .recover` may save what it held)"
        )
    if "disk i/o error" in low:
        return (
            f"{what} {path} cannot be written (disk I/O error: check the disk with `dmesg` and "
            f"`df {path.parent}`); run the command again once it is fixed"
        )
    if any(m in low for m in _CANNOT_OPEN):
        if (long := path_too_long(path)) is not None:
            return long
        return (
            f"{what} {path} cannot be opened (its folder is missing or not searchable: check "
            f"`ls -ld {path.parent}`)"
        )
    return None
