"""Faults of the environment as one line and exit code 3: a full disk, a tracking server, Optuna
storage or Dask scheduler that cannot be reached.

The terminal gets one line naming the cause; the full traceback goes to a log file under
``$NLLAB_HOME/logs`` that the line names. Only the standard library loads here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tasks.errors import Unreachable
from tasks.tracking.sqlite_faults import sqlite_problem

__all__ = [
    "MIN_FREE_MB",
    "EnvironmentFault",
    "check_free_space",
    "connect_error",
    "describe_fault",
    "fault_in_text",
    "names_fault",
    "reserve_log_space",
    "write_log",
]

#: Free megabytes a command needs in ``$NLLAB_HOME`` to start (``NLLAB_MIN_FREE_MB`` overrides):
#: the MLflow store, the Prefect database and the data cache all grow as it runs, and a disk that
#: fills up mid-run fails every cell at once.
MIN_FREE_MB = 50.0

_DISK_FULL = ("database or disk is full", "no space left on device", "disk quota exceeded")
_UNREACHABLE = (
    "connection refused",
    "max retries exceeded",
    "failed to establish a new connection",
    "name or service not known",
    "could not connect to server",
    "connection reset by peer",
    "remotedisconnected",
)


class EnvironmentFault(RuntimeError):
    """The machine, not the command, is at fault (exit 3); the message says what to do."""


def _free_mb(folder: Path) -> float | None:
    try:
        return shutil.disk_usage(folder).free / 2**20
    except OSError:
        return None


def check_free_space(folder: Path, min_mb: float | None = None) -> None:
    """Raise :class:`EnvironmentFault` when ``folder``'s disk has less than ``min_mb`` free
    (default ``NLLAB_MIN_FREE_MB``, else :data:`MIN_FREE_MB`)."""
    if min_mb is None:
        try:
            min_mb = float(os.environ.get("NLLAB_MIN_FREE_MB", MIN_FREE_MB))
        except ValueError:
            min_mb = MIN_FREE_MB
    free = _free_mb(folder)
    if free is not None and free < min_mb:
        raise EnvironmentFault(
            f"only {free:.1f} MB free on the disk of {str(folder)!r} (at least {min_mb:.0f} MB "
            "needed: the MLflow store, Prefect's database and the data cache grow as a command "
            "runs); free some space or set NLLAB_HOME to a folder on another disk"
        )


def connect_error(address: str, timeout: float) -> OSError | ValueError | None:
    """Why nothing accepts a TCP connection at ``scheme://host:port`` within ``timeout``
    seconds (``None`` when something does, or for a scheme that is not probed)."""
    import socket

    scheme, _, rest = address.partition("://")
    if scheme not in ("tcp", "tls"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout).close()
    except (OSError, ValueError) as e:
        return e
    return None


def _chain(error: BaseException | None) -> list[BaseException]:
    """``error`` and the exceptions it was raised from or during, outermost first."""
    seen: list[BaseException] = []
    while error is not None and error not in seen and len(seen) < 32:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def names_fault(message: str) -> bool:
    """Whether a log message is about a fault of the environment (e.g. Prefect's "Finished in
    state Failed('... database or disk is full')", urllib3's retries against a tracking server
    that is gone)."""
    return fault_in_text(message) is not None


def fault_in_text(text: str, home: Path | None = None) -> str | None:
    """:func:`describe_fault` of an error known only by its text (a failed cell's ``error``)."""
    return describe_fault(RuntimeError(text), home)


def describe_fault(error: BaseException, home: Path | None = None) -> str | None:
    """One line naming the environmental cause of ``error``, or ``None`` if it is not one."""
    chain = _chain(error)
    for e in chain:
        if isinstance(e, EnvironmentFault | Unreachable) and str(e):
            return str(e)  # already the one line, naming the fault: never said again inside
    for e in chain:
        text = f"{type(e).__name__}: {e}".lower()
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or any(marker in text for marker in _DISK_FULL):
            where = home if home is not None else Path(getattr(e, "filename", None) or ".")
            free = _free_mb(where)
            left = f" ({free:.1f} MB free)" if free is not None else ""
            return (
                f"the disk of {str(where)!r} is full{left}: free some space, then run the same "
                "command again (finished work is kept)"
            )
    # The MLflow store's sqlite errors: busy (and who holds it), read-only, damaged, too long.
    if (store := _embedded_store(home)) is not None:
        for e in chain:
            if _from_mlflow(e, chain) and (line := sqlite_problem(str(e), store)) is not None:
                return line
    for e in chain:
        text = str(e).lower()
        if any(marker in text for marker in _UNREACHABLE):
            uri = os.environ.get("MLFLOW_TRACKING_URI", "")
            if uri.startswith(("http://", "https://")) and (
                "mlflow" in type(e).__module__ or "/api/2.0/mlflow" in text or uri in str(e)
            ):
                return (
                    f"the MLflow tracking server {uri} stopped answering; start it again, then "
                    "run the same command (finished cells are kept)"
                )
    unreachable = next((e for e in chain if isinstance(e, Unreachable)), None)
    return type(unreachable).__name__ if unreachable is not None else None


def _embedded_store(home: Path | None) -> Path | None:
    """The embedded MLflow store's sqlite file, ``None`` when runs go to a tracking server."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///"))
    if uri:
        return None
    if home is None:
        from datasets import data_home

        home = data_home()
    return home / "mlflow" / "mlflow.db"


def _from_mlflow(error: BaseException, chain: list[BaseException]) -> bool:
    """Whether ``error`` came out of MLflow (its store), not Optuna's or Prefect's database."""
    if any(type(e).__module__.startswith("mlflow") or "mlflow" in str(e).lower() for e in chain):
        return True  # raised by MLflow, or a failed cell's text naming it
    tb = error.__traceback__
    while tb is not None:
        if "/mlflow/" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


#: Space kept free for the details log in ``$NLLAB_HOME/logs`` (:func:`reserve_log_space`):
#: freed when the disk is full, so that the log of a full disk is written beside the store.
LOG_RESERVE_BYTES = 256 * 1024
_RESERVE = ".reserve"


def reserve_log_space(home: Path) -> None:
    """Keep :data:`LOG_RESERVE_BYTES` of ``home/logs`` taken by a placeholder (made once, when
    there is room), which :func:`write_log` frees should the disk fill up."""
    reserve = home / "logs" / _RESERVE
    try:
        if reserve.is_file() and reserve.stat().st_size >= LOG_RESERVE_BYTES:
            return
        reserve.parent.mkdir(parents=True, exist_ok=True)
        with open(reserve, "wb") as fh:
            fh.write(b"\0" * LOG_RESERVE_BYTES)  # real blocks (not a sparse file)
    except OSError:
        pass  # no room for it: logs are then written where there is


def write_log(command: str, error: BaseException, home: Path | None) -> Path | None:
    """Write ``error``'s full traceback to ``home/logs`` (else the temporary folder), readable
    by the user only (mode 600: it may quote paths and settings); the path, or ``None`` when no
    file could be written. On a full disk the home's reserve is freed for it first."""
    text = "".join(traceback.format_exception(error))
    name = f"nllab-{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    body = f"nllab {' '.join(sys.argv[1:])}\n\n{text}".encode()
    if home is not None:
        for free_reserve in (False, True):
            if free_reserve:
                (home / "logs" / _RESERVE).unlink(missing_ok=True)
            if (path := _write_private(home / "logs" / name, body)) is not None:
                return path
    return _write_private(Path(tempfile.gettempdir()) / name, body)


def _write_private(path: Path, body: bytes) -> Path | None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)  # a log cut short by the full disk
        return None
    return path
