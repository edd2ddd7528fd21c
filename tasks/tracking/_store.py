"""The store of the MLflow adapter: where it is, how it is created, opened and locked.

Every MLflow call of the platform goes through :mod:`tasks.tracking`; this module holds what its
tracking objects share, the :class:`Store`: the resolved settings, the client and the
experiment, the lock under which the embedded sqlite store is created
(:mod:`tasks.tracking._schema`) and the move of a copied home's artifact locations.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.entities import RunTag
from mlflow.exceptions import MlflowException

from datasets import data_home
from tasks.config import TrackingConfig
from tasks.errors import Unreachable
from tasks.tracking._schema import create_embedded_store
from tasks.tracking.locations import embedded_tracking_uri, store_path
from tasks.tracking.sqlite_faults import sqlite_problem
from tasks.tracking.tags import ExperimentTags

__all__ = [
    "Store",
    "TrackingSettings",
    "TrackingUnavailable",
    "embedded_tracking_uri",
    "git_commit",
    "point_mlflow_at",
    "relocate_artifacts",
    "relocate_home_references",
    "store_identity",
]


class TrackingUnavailable(Unreachable):
    """The tracking store cannot be reached or used."""


def _embedded_artifact_root() -> str:
    return str((data_home() / "mlflow" / "artifacts").resolve())


def git_commit() -> str:
    """The commit of the source tree the platform runs from, or ``unknown``."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def relocate_artifacts(db_path: str | Path, old_root: str, new_root: str) -> int:
    """Rewrite artifact locations under ``old_root`` to ``new_root`` in an embedded (sqlite)
    MLflow store; returns the number of rows changed. Runs in one transaction."""
    import sqlite3

    columns = (
        ("experiments", "artifact_location"),
        ("runs", "artifact_uri"),
        ("logged_models", "artifact_location"),
        ("model_versions", "storage_location"),  # a registered logged model's own folder
    )
    changed = 0
    with sqlite3.connect(str(db_path), timeout=60) as db:
        tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
        for table, column in columns:
            if table not in tables:
                continue
            cur = db.execute(
                f"update {table} set {column} = ? || substr({column}, ?) "
                f"where substr({column}, 1, ?) = ? "
                f"and (length({column}) = ? or substr({column}, ?, 1) = '/')",
                (
                    new_root,
                    len(old_root) + 1,
                    len(old_root),
                    old_root,
                    len(old_root),
                    len(old_root) + 1,
                ),
            )
            changed += cur.rowcount
    return changed


_ARTIFACTS_SUFFIX = "/mlflow/artifacts"


def relocate_home_references(db_path: str | Path, old_root: str, new_root: str) -> int:
    """What else of a copied home names the original, once its artifact locations moved
    (:func:`relocate_artifacts`): the data sets' sources (the cache beside the old store) in
    the store, and each logged model's ``MLmodel`` ``artifact_path`` under ``new_root``; the
    number of places changed. Idempotent."""
    import json
    import sqlite3

    old_home = old_root.removeprefix("file://").removesuffix(_ARTIFACTS_SUFFIX)
    new_home = new_root.removeprefix("file://").removesuffix(_ARTIFACTS_SUFFIX)
    # '{"uri": "<home>/cache"}': the home's own paths only (a quote, the home, a slash)
    old, new = (f'"{json.dumps(h)[1:-1]}/' for h in (old_home, new_home))
    with sqlite3.connect(str(db_path), timeout=60) as db:
        changed = db.execute(
            "update datasets set dataset_source = replace(dataset_source, ?, ?) "
            "where instr(dataset_source, ?) > 0",
            (old, new, old),
        ).rowcount
    for mlmodel in Path(new_root.removeprefix("file://")).glob("models/*/artifacts/MLmodel"):
        changed += _rewrite_artifact_path(mlmodel, old_root, new_root)
    return changed


def _rewrite_artifact_path(mlmodel: Path, old_root: str, new_root: str) -> int:
    """``MLmodel``'s ``artifact_path: <old_root>/…`` line pointed at ``new_root`` (written
    aside, then moved over it); 1 if it changed."""
    try:
        text = mlmodel.read_text()
    except OSError:
        return 0
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("artifact_path: ") and line[15:].startswith(old_root + "/"):
            lines[i] = "artifact_path: " + new_root + line[15 + len(old_root) :]
            tmp = mlmodel.with_name(f".MLmodel.{os.getpid()}.tmp")
            tmp.write_text("".join(lines))
            os.replace(tmp, mlmodel)
            return 1
    return 0


def _foreign_artifact_roots(db_path: str | Path, root: str) -> list[str]:
    """Artifact roots of the embedded default layout (``.../mlflow/artifacts``) that an
    embedded store's experiments record, other than ``root``: those of the home it was
    copied or moved from."""
    import sqlite3

    suffix = _ARTIFACTS_SUFFIX
    with contextlib.closing(sqlite3.connect(str(db_path), timeout=60)) as db:
        rows = db.execute("select distinct artifact_location from experiments").fetchall()
    found = []
    for (location,) in rows:
        loc = (location or "").removeprefix("file://").rstrip("/")
        if "://" in loc or not loc.endswith(suffix) or loc == root:
            continue
        found.append(location.rstrip("/"))
    return found


@contextmanager
def _store_lock(db_path: Path) -> Iterator[None]:
    """Exclusive lock on ``<db>.lock`` (``flock``): one process at a time creates the store.

    Raises :class:`TrackingUnavailable` when the store's folder cannot be written.
    """
    folder = db_path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, "permission denied")
        fd = os.open(db_path.with_name(db_path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise TrackingUnavailable(
            f"the MLflow store folder {folder} is not writable ({e.strerror or e}); set "
            "NLLAB_HOME to a writable folder (or MLFLOW_TRACKING_URI to a tracking server)"
        ) from None
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover (no flock on Windows; creation is still atomic)
            pass
        yield
    finally:
        os.close(fd)


def _damage(db_path: Path) -> str | None:
    """sqlite's own words when ``PRAGMA quick_check`` finds the store's pages damaged, else
    ``None`` (a busy store is told elsewhere). Where a store is opened for writing: a damaged
    page that MLflow's queries do not happen to read would otherwise pass unseen until a write
    meets it. quick_check reads every page but skips matching indexes against their tables
    (sqlite.org/pragma.html#pragma_quick_check): measured 0.03 s on a 1 MB store, 0.7 s on a
    368 MB one with 2 million metric rows (warm cache; integrity_check took 5.3 s)."""
    import sqlite3

    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=60)
        ) as db:
            rows = db.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as e:  # not a database, busy: said as MLflow opens it
        return str(e) if "malformed" in str(e) else None
    return None if rows == [("ok",)] else str(rows[0][0] if rows else "no answer")


def _broken_store_message(db_path: Path, error: BaseException) -> str:
    # busy, read-only, full or too long a path: said as such (moving the store would not help)
    if (line := sqlite_problem(str(error), db_path)) is not None:
        return line
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    return (
        f"the MLflow store {db_path} cannot be opened ({type(error).__name__}: {first}); if an "
        f"older nllab killed while creating it damaged it, move it aside (mv {db_path} "
        f"{db_path}.broken) and run the command again: a new, empty store is made"
    )


@dataclass(frozen=True)
class TrackingSettings:
    """Resolved tracking location. ``artifact_root`` is ``None`` when a server decides it."""

    tracking_uri: str
    artifact_root: str | None
    experiment: str

    @classmethod
    def resolve(cls, config: TrackingConfig | None = None) -> TrackingSettings:
        config = config or TrackingConfig()
        uri = (
            config.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or embedded_tracking_uri()
        )
        root = os.environ.get("NLLAB_ARTIFACT_ROOT") or None
        if root is None and uri.startswith("sqlite:"):
            # Without an absolute location MLflow would write ./mlruns next to the caller's cwd.
            root = _embedded_artifact_root()
        if root is not None and "://" not in root:
            root = str(Path(root).expanduser().resolve())
        experiment = config.experiment or os.environ.get("NLLAB_EXPERIMENT") or "nllab"
        return cls(tracking_uri=uri, artifact_root=root, experiment=experiment)

    @property
    def is_embedded(self) -> bool:
        return self.tracking_uri.startswith("sqlite:")


def _store_file(settings: TrackingSettings) -> Path | None:
    """The sqlite file of an embedded store; ``None`` for a tracking server."""
    return store_path(settings.tracking_uri)


def store_identity(settings: TrackingSettings) -> tuple[int, int] | None:
    """``(device, inode)`` of an embedded store's non-empty file, ``None`` for a server store;
    ``(-1, -1)`` when the file is missing or empty (never equal to an opened store's)."""
    db_path = _store_file(settings)
    if db_path is None:
        return None
    try:
        st = db_path.stat()
    except OSError:
        return (-1, -1)
    return (st.st_dev, st.st_ino) if st.st_size > 0 else (-1, -1)


def point_mlflow_at(settings: TrackingSettings) -> None:
    """Make MLflow's own (fluent) helpers use the same store as the platform's client calls:
    model logging and registry downloads go through them."""
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_registry_uri(settings.tracking_uri)


class Store:
    """One experiment of one tracking store: the settings, the client, the experiment id, the
    store's lock and the run search that the tracking objects share (each holds one)."""

    def __init__(self, settings: TrackingSettings, experiment_id: str | None = None) -> None:
        self.settings = settings
        self.client = MlflowClient(tracking_uri=settings.tracking_uri)
        self._experiment_id = experiment_id

    @classmethod
    def open(cls, settings: TrackingSettings) -> Store:
        """A fresh, checked store: the embedded sqlite schema created (under a file lock, aside,
        moved into place complete) and the experiment opened or created. Raises
        :class:`TrackingUnavailable` with what to do when the store cannot be used."""
        db_path = _store_file(settings)
        if db_path is None:
            return cls._open(settings)
        with _store_lock(db_path):
            try:
                create_embedded_store(db_path, settings.artifact_root)
            except Exception as e:
                raise TrackingUnavailable(_broken_store_message(db_path, e)) from None
            if (damage := _damage(db_path)) is not None:
                problem = f"database disk image is malformed: {damage[:120]}"
                raise TrackingUnavailable(_broken_store_message(db_path, RuntimeError(problem)))
            return cls._open(settings, db_path)

    @classmethod
    def _open(cls, settings: TrackingSettings, db_path: Path | None = None) -> Store:
        try:
            store = cls(settings)
            store._experiment_id = store._ensure_experiment()
            store._follow_moved_home()
        except TrackingUnavailable:
            raise
        except Exception as e:
            if db_path is not None:
                raise TrackingUnavailable(_broken_store_message(db_path, e)) from None
            raise TrackingUnavailable(
                f"cannot use the MLflow tracking store at {settings.tracking_uri!r}: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n"
                "Check MLFLOW_TRACKING_URI (or mlflow.env); unset it to use the embedded store "
                f"under {data_home()}."
            ) from e
        return store

    def is_active(self) -> bool:
        """Whether the experiment is still there and not deleted (raises if the store does not
        answer)."""
        return self.client.get_experiment(self.experiment_id).lifecycle_stage == "active"

    def _follow_moved_home(self) -> None:
        """Keep the home self-contained: point every artifact location the embedded store
        records (absolute paths, as MLflow stores them) at the artifact folder beside it.

        Only for the embedded default layout (this home's own ``mlflow.db``). Any recorded
        root ``<somewhere>/mlflow/artifacts`` other than this home's is rewritten, whether or not
        it still exists: after ``cp -a`` of a home, the copy's new runs, models and registry
        versions then live in the copy, never in the original (which may be deleted without
        losing anything of the copy's); the data sets' sources and the models' ``MLmodel``
        files name the copy too. Idempotent, so concurrent processes may both call it.
        """
        new = self.settings.artifact_root
        if (
            self.settings.tracking_uri != embedded_tracking_uri()  # another home's store: not ours
            or os.environ.get("NLLAB_ARTIFACT_ROOT")
            or new != _embedded_artifact_root()
        ):
            return
        db = self.settings.tracking_uri.removeprefix("sqlite:///")
        for old in _foreign_artifact_roots(db, new):
            # the references first: the artifact locations are what marks a copy as unmoved
            relocate_home_references(db, old, new)
            relocate_artifacts(db, old, new)

    def _ensure_experiment(self) -> str:
        name = self.settings.experiment
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                raise TrackingUnavailable(
                    f"experiment {name!r} is deleted; restore it in the MLflow UI or choose "
                    "another name (NLLAB_EXPERIMENT)"
                )
            return exp.experiment_id
        try:
            return self.client.create_experiment(
                name,
                artifact_location=self.settings.artifact_root,
                tags={
                    ExperimentTags.KIND: ExperimentTags.MODEL_TRAINING
                },  # the UI's model-training view, not the GenAI one
            )
        except MlflowException:
            # Another process created it between our lookup and create.
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """The embedded store's file lock; nothing for a server store."""
        db_path = _store_file(self.settings)
        return contextlib.nullcontext() if db_path is None else _store_lock(db_path)

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            raise RuntimeError("the store is not open; use tasks.tracking.connect()")
        return self._experiment_id

    def search(self, filter_string: str, order_by: list[str] | None = None) -> Iterator:
        """Every run of the experiment matching ``filter_string`` (page after page)."""
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                filter_string=filter_string,
                max_results=1000,
                order_by=order_by,
                page_token=token,
            )
            yield from page
            token = page.token
            if not token:
                return

    def set_tags(self, run_id: str, tags: Mapping[str, object]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def end_run(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)
