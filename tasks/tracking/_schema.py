"""The embedded (sqlite) MLflow store's creation: its schema built aside and moved into place,
so that no process ever sees (and no kill ever leaves) a half-made store, and copied from a
template of this MLflow's schema where one is kept (a copy takes milliseconds; MLflow's some
60 Alembic migrations take a second or more).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow

from datasets import cache_folders

__all__ = ["create_embedded_store"]


def create_embedded_store(db_path: Path, artifact_root: str | None) -> None:
    """Create the sqlite schema aside and move it into place, so that no process ever sees (and
    no kill ever leaves) a half-migrated store under the real name. Call under the store's lock
    (:class:`tasks.tracking.Store` takes it).

    The schema is copied from a template of this MLflow's (:func:`_schema_templates`) where one
    is kept, else built by MLflow's migrations and kept as the template for the next store.
    """
    for leftover in db_path.parent.glob(f".{db_path.name}.*.tmp"):
        leftover.unlink(missing_ok=True)  # a creation killed before its rename
    if db_path.exists() and db_path.stat().st_size > 0:
        return  # an empty file holds nothing: it is replaced
    tmp = db_path.with_name(f".{db_path.name}.{os.getpid()}.tmp")
    root = artifact_root or str(db_path.parent)
    try:
        templates = _schema_templates()
        if not any(_open_schema(tmp, root, template) for template in templates):
            _open_schema(tmp, root, None)
            _keep_template(tmp, templates)
        with open(tmp, "rb+") as f:  # once, in place of each migration's own syncs
            os.fsync(f.fileno())
        os.replace(tmp, db_path)
    finally:
        tmp.unlink(missing_ok=True)


def _schema_templates() -> list[Path]:
    """Where the template of this MLflow's empty sqlite store is kept, in the order read and
    written (:func:`datasets.cache_folders`: the installation's cache, then the home's), named
    by the versions that make its schema."""
    import sqlite3

    import sqlalchemy

    name = f"mlflow-{mlflow.__version__}-sqlalchemy-{sqlalchemy.__version__}"
    name += f"-sqlite-{sqlite3.sqlite_version}.db"
    return [folder / name for folder in cache_folders("mlflow-schema")]


def _open_schema(tmp: Path, artifact_root: str, template: Path | None) -> bool:
    """Make ``tmp`` an empty store of artifact root ``artifact_root``: a copy of ``template``
    (MLflow checks that its schema is its own and adds the Default experiment at this root),
    or, given None, a schema built by MLflow's migrations; whether it was made."""
    import sqlite3

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    if template is not None:
        try:  # checked here: MLflow retries a file that is no database for minutes
            shutil.copyfile(template, tmp)
            with contextlib.closing(sqlite3.connect(f"file:{tmp}?mode=ro", uri=True)) as db:
                whole = db.execute("PRAGMA quick_check(1)").fetchall() == [("ok",)]
                versions = db.execute("select count(*) from alembic_version").fetchone()
            if not whole or versions != (1,):
                raise sqlite3.DatabaseError(f"{template} is no store template")
        except (OSError, sqlite3.Error):
            tmp.unlink(missing_ok=True)
            return False
    uri = f"sqlite:///{tmp}"
    try:
        with _unsynced(tmp):
            SqlAlchemyStore(uri, artifact_root)
    except Exception:
        if template is None:
            raise
        tmp.unlink(missing_ok=True)  # another MLflow's or damaged: built afresh below
        return False
    finally:
        # MLflow keeps an engine per URI: a scratch file's would hold its connections open
        engine = getattr(SqlAlchemyStore, "_engine_map", {}).pop(uri, None)
        if engine is not None:
            engine.dispose()
    return True


def _keep_template(store: Path, templates: list[Path]) -> None:
    """Keep a copy of the new empty ``store`` as the first of ``templates`` that can be
    written, without its experiments (a store made from it creates its own Default experiment,
    at its own artifact root); where none can, the next store is built by migrations again."""
    import sqlite3

    for template in templates:
        part = template.with_name(f".{template.name}.{os.getpid()}.tmp")
        try:
            template.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_parts(template)
            shutil.copyfile(store, part)
            with contextlib.closing(sqlite3.connect(str(part))) as db, db:
                db.execute("delete from experiment_tags")
                db.execute("delete from experiments")
            os.replace(part, template)  # atomic: a reader copies the old file or the new one
            return
        except (OSError, sqlite3.Error):
            with contextlib.suppress(OSError):
                part.unlink(missing_ok=True)


#: A template's partial copy older than this was left by a killed process (a copy takes
#: milliseconds).
_STALE_PART_SECONDS = 10 * 60


def _remove_stale_parts(template: Path) -> None:
    """Delete the partial copies of ``template`` that killed processes left (a live one, young,
    is kept)."""
    cutoff = time.time() - _STALE_PART_SECONDS
    for part in template.parent.glob(f".{template.name}.*.tmp"):
        with contextlib.suppress(OSError):  # removed meanwhile by another process
            if part.stat().st_mtime < cutoff:
                part.unlink()


@contextmanager
def _unsynced(tmp: Path) -> Iterator[None]:
    """Connections to the file ``tmp`` skip sqlite's syncs and disk journal while inside.

    MLflow's schema comes from some 60 Alembic migrations, each committed and synced on its
    own: 4-5 s on an ordinary disk, 0.6 s without the syncs
    (sqlite.org/pragma.html#pragma_synchronous).
    Safe here only: ``tmp`` is a scratch file that takes the store's name once it is complete
    and synced, and a creation killed half-way leaves a file that the next one deletes.
    """
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    target = os.path.realpath(tmp)

    def skip_syncs(dbapi_conn, _record) -> None:
        (_, _, name), *_ = dbapi_conn.execute("PRAGMA database_list").fetchall()
        if name and os.path.realpath(name) == target:
            dbapi_conn.execute("PRAGMA synchronous = OFF")
            dbapi_conn.execute("PRAGMA journal_mode = MEMORY")

    event.listen(Engine, "connect", skip_syncs)
    try:
        yield
    finally:
        event.remove(Engine, "connect", skip_syncs)
