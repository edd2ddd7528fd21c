"""Whether an sqlite storage URL can keep what is written to it: one in memory loses it at exit,
and one in a folder that does not exist would need a folder nobody named created.

Only the standard library loads here, so a command can refuse such a URL before Optuna or
SQLAlchemy load.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["sqlite_file", "sqlite_storage_problem"]


def sqlite_file(url: str) -> Path | None:
    """The file of an ``sqlite://`` URL (``None`` when it is in memory or not sqlite)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme.lower().startswith("sqlite"):
        return None
    rest, _, query = rest.partition("?")
    database = rest[1:] if rest.startswith("/") else rest  # sqlite:///rel, sqlite:////abs
    if database.startswith("file:"):
        database = database.removeprefix("file:")
    if database in ("", ":memory:") or "mode=memory" in query:
        return None
    return Path(database).expanduser()


def sqlite_storage_problem(url: str) -> str | None:
    """Why the sqlite ``url`` cannot hold a study that outlives the command, or ``None`` (also
    for any URL that is not sqlite)."""
    if not url.lower().startswith("sqlite"):
        return None
    path = sqlite_file(url)
    if path is None:
        return (
            f"the Optuna storage {url!r} is in memory: the study would be lost when the command "
            "exits; name a file, e.g. sqlite:////ABS/PATH/optuna.db"
        )
    if not path.parent.is_dir():
        return (
            f"the folder {str(path.parent)!r} of the Optuna storage {url!r} does not exist; "
            "create it first (nothing is created outside folders you made)"
        )
    return None
