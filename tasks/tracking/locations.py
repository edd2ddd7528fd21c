"""Where the tracking store is, and what its embedded (sqlite) registry holds, answered with
the standard library only.

The command line's checks ask these questions before anything heavy loads (a misspelt registry
URI or a store path sqlite cannot open answers in a fraction of a second); the tracking
package's store opens the same path.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path

__all__ = [
    "embedded_store_path",
    "embedded_tracking_uri",
    "has_finished_run",
    "registered_version",
    "store_path",
    "stored_model",
    "tracking_uri",
]


def embedded_store_path() -> Path:
    """The embedded store's sqlite file: ``mlflow/mlflow.db`` under the platform's home
    (``$NLLAB_HOME``, else ``~/.nllab``, as :func:`datasets.data_home`)."""
    env = os.environ.get("NLLAB_HOME")
    home = Path(env).expanduser() if env else Path.home() / ".nllab"
    return (home / "mlflow" / "mlflow.db").resolve()


def embedded_tracking_uri() -> str:
    return f"sqlite:///{embedded_store_path()}"


def tracking_uri() -> str:
    """The tracking URI a command uses without a configured one: ``MLFLOW_TRACKING_URI``, else
    the embedded store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or embedded_tracking_uri()


def store_path(uri: str) -> Path | None:
    """The sqlite file of an embedded store's URI; ``None`` for a tracking server."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def registered_version(ref: str, uri: str | None = None) -> tuple[bool | None, list[str]]:
    """Whether the embedded store at ``uri`` (default :func:`tracking_uri`) holds the registry
    version ``ref`` (``NAME@ALIAS`` or ``NAME/VERSION``), and the registered models' names.

    ``None`` when it cannot say: a server store, or an old or busy sqlite file (MLflow itself
    answers later). A store file that does not exist holds nothing."""
    if "@" in ref:
        query = "select 1 from registered_model_aliases where name = ? and alias = ?"
        args: tuple[str, ...] = tuple(ref.split("@", 1))
    else:
        query = "select 1 from model_versions where name = ? and cast(version as text) = ?"
        args = tuple(ref.rsplit("/", 1))
    names = "select name from registered_models"
    return _holds(query, args, names, uri)


def stored_model(kind: str, key: str, uri: str | None = None) -> bool | None:
    """Whether the embedded store holds the logged model (``kind`` ``logged``, ``key`` its id)
    or the run (``run``, its id) a model URI names; ``None`` when it cannot say (as
    :func:`registered_version`)."""
    query = {
        "logged": "select 1 from logged_models where model_id = ?",
        "run": "select 1 from runs where run_uuid = ?",
    }[kind]
    return _holds(query, (key,), None, uri)[0]


def has_finished_run(kind: str, uri: str | None = None) -> bool | None:
    """Whether the embedded store holds a FINISHED, undeleted run tagged ``nllab.kind`` =
    ``kind`` in any experiment (``None`` when it cannot say: a server, an old, busy or damaged
    file — ``PRAGMA quick_check``, as the store's opening runs it, so that a damaged store is
    reported by the command's full path, not answered "nothing"). A command with nothing to
    read answers from this without loading MLflow."""
    query = (
        "select 1 from runs r join tags t on t.run_uuid = r.run_uuid where t.key = 'nllab.kind' "
        "and t.value = ? and r.status = 'FINISHED' and r.lifecycle_stage = 'active' limit 1"
    )
    return _holds(query, (kind,), None, uri, checked=True)[0]


def _holds(
    query: str, args: tuple[str, ...], names: str | None, uri: str | None, checked: bool = False
) -> tuple[bool | None, list[str]]:
    """Whether ``query`` finds a row in the embedded store, and (when not) the first column of
    ``names``' rows."""
    db_path = store_path(uri or tracking_uri())
    if db_path is None:
        return None, []
    if not db_path.is_file():
        return False, []
    try:
        with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)) as db:
            if checked and db.execute("PRAGMA quick_check").fetchone() != ("ok",):
                return None, []
            if db.execute(query, args).fetchone() is not None:
                return True, []
            return False, sorted(r[0] for r in db.execute(names)) if names else []
    except sqlite3.Error:
        return None, []
