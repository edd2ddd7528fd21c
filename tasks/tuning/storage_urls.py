"""Whether a storage URL can keep what is written to it: an sqlite one in memory loses it at
exit, one in a folder that does not exist would need a folder nobody named created; any other
must be a URL SQLAlchemy can open with a driver that is installed.

:func:`sqlite_storage_problem` loads only the standard library, so a command can refuse such a
URL before Optuna or SQLAlchemy load; :func:`storage_url_problem` loads SQLAlchemy (no
connection is made).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "default_storage_url",
    "redact",
    "sqlite_file",
    "sqlite_storage_problem",
    "storage_url_problem",
]

#: What a storage URL looks like, said with every refusal.
_EXAMPLES = "sqlite:////ABS/PATH/optuna.db or postgresql+psycopg2://USER:PASSWORD@HOST:5432/optuna"


def default_storage_url() -> str:
    """The Optuna storage of studies that name none: sqlite under the data home."""
    from datasets import data_home

    return f"sqlite:///{(data_home() / 'optuna' / 'optuna.db').resolve()}"


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


def redact(url: str) -> str:
    """The URL with any password hidden (for logs, tags and printed commands)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def storage_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be opened as a storage that keeps its studies, found without
    connecting (``None`` when it can be tried): :func:`sqlite_storage_problem`, a string
    SQLAlchemy cannot parse, a database it has no dialect for, a driver not installed. A
    scheduled or later run is refused now rather than when it opens the storage."""
    if (problem := sqlite_storage_problem(url)) is not None:
        return problem
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = redact(url)
    try:
        make_url(url).get_dialect().import_dbapi()
    except NoSuchModuleError:  # an ArgumentError too: first
        scheme = url.partition(":")[0]
        return (
            f"the Optuna storage {shown!r}: SQLAlchemy has no database {scheme!r}; use {_EXAMPLES}"
        )
    except ArgumentError:
        return f"the Optuna storage {shown!r} is not an SQLAlchemy URL; use one such as {_EXAMPLES}"
    except ImportError as e:
        return (
            f"the Optuna storage {shown!r} needs the database driver {e.name!r}, which is not "
            "installed here"
        )
    return None
