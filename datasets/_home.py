"""The platform's home folder (``$NLLAB_HOME``), checked writable before any work starts, and
the installation's cache, which every home of an installation shares.

Standard library only: every command checks its home before numpy loads.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from pathlib import Path

__all__ = [
    "CacheError",
    "cache_folders",
    "create_home",
    "data_home",
    "installation_cache",
    "require_writable_home",
]


class CacheError(OSError):
    """The cache directory cannot be created or written."""


def data_home() -> Path:
    """The platform's data folder: ``$NLLAB_HOME`` if set, else ``~/.nllab`` (never the cwd)."""
    env = os.environ.get("NLLAB_HOME")
    return Path(env).expanduser() if env else Path.home() / ".nllab"


def installation_cache(name: str) -> Path | None:
    """The folder ``name`` of this installation's cache, beside the Python environment the
    platform runs in (``<sys.prefix>/var/cache/nllab/<name>``; ``$NLLAB_INSTALL_CACHE/<name>``
    where set), created if missing: for what depends only on the code, the machine and the
    environment, each entry keyed by them, so that a new home finds what another home of the
    installation computed. None where it cannot be created, or is not this user's own or can be
    written by others (an entry planted there would be believed): the caller keeps its entries
    in the home instead. Whether it can be written is for the caller's write to find."""
    configured = os.environ.get("NLLAB_INSTALL_CACHE")
    base = Path(configured).expanduser() if configured else Path(sys.prefix) / "var/cache/nllab"
    folder = base / name
    try:
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError:
        return None
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return folder


def cache_folders(name: str) -> list[Path]:
    """Where a cache of what depends only on the code, the machine and the environment keeps
    its entries, in the order they are read and written: the installation's folder ``name``
    (:func:`installation_cache`) where it can be used, then the home's."""
    shared = installation_cache(name)
    return [*([shared] if shared is not None else []), data_home() / name]


def create_home() -> Path:
    """``data_home()``, created if missing private to this user (mode 700): the stores, the
    artifacts, the data and the logs in it are readable by nobody else, whatever modes the
    libraries give their own files (SQLite and MLflow follow the process's umask: 644). A home
    that exists keeps its mode (``nllab doctor`` says when others can read it). OSError when
    it cannot be created."""
    home = data_home()
    if not home.is_dir():
        for folder in (home, *home.parents):  # a file where a folder must be: say that
            if folder.exists() and not folder.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
        home.parent.mkdir(parents=True, exist_ok=True)
        try:
            home.mkdir(mode=0o700)
        except FileExistsError:
            pass  # made meanwhile by another process (privately too)
    return home


def require_writable_home() -> Path:
    """:func:`create_home`; raises :class:`CacheError` naming the folder and what to do when it
    cannot be written (checked before any work starts)."""
    home = data_home()
    try:
        create_home()
        tempfile.TemporaryFile(dir=home).close()
    except OSError as err:
        raise CacheError(
            f"the data folder {str(home)!r} is not writable ({err.strerror or err}); it holds the "
            "data cache, the MLflow store and Prefect's database: set NLLAB_HOME to a writable "
            "folder"
        ) from None
    return home
