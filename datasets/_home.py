"""The platform's home folder (``$NLLAB_HOME``), checked writable before any work starts.

Standard library only: every command checks its home before numpy loads.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["CacheError", "data_home", "require_writable_home"]


class CacheError(OSError):
    """The cache directory cannot be created or written."""


def data_home() -> Path:
    """The platform's data folder: ``$NLLAB_HOME`` if set, else ``~/.nllab`` (never the cwd)."""
    env = os.environ.get("NLLAB_HOME")
    return Path(env).expanduser() if env else Path.home() / ".nllab"


def require_writable_home() -> Path:
    """``data_home()``, created if needed; raises :class:`CacheError` naming the folder and what
    to do when it cannot be written (checked before any work starts)."""
    home = data_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=home).close()
    except OSError as err:
        raise CacheError(
            f"the data folder {str(home)!r} is not writable ({err.strerror or err}); it holds the "
            "data cache, the MLflow store and Prefect's database: set NLLAB_HOME to a writable "
            "folder"
        ) from None
    return home
