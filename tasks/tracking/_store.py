"""The store of the MLflow adapter: where it is, how it is created, opened and locked.

Every MLflow call of the platform goes through :mod:`tasks.tracking`; this module holds the
connection half of its :class:`~tasks.tracking.Tracker`: the resolved settings, the embedded
sqlite store (created aside under a file lock, so no process sees a half-made one), the move of
a copied home's artifact locations, and one connection per process and store
(:meth:`_StoreMixin.connect`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from datasets import data_home
from tasks._sqlite_faults import sqlite_problem
from tasks.config import TrackingConfig

__all__ = [
    "TrackingSettings",
    "TrackingUnavailable",
    "embedded_tracking_uri",
    "git_commit",
    "relocate_artifacts",
]

#: Experiment tags the MLflow UI reads: the experiment's kind (which view it opens on).
_KIND_TAG, _KIND_ML = "mlflow.experimentKind", "custom_model_development"


class TrackingUnavailable(RuntimeError):
    """The tracking store cannot be reached or used."""


def embedded_tracking_uri() -> str:
    return f"sqlite:///{(data_home() / 'mlflow' / 'mlflow.db').resolve()}"


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


def _foreign_artifact_roots(db_path: str | Path, root: str) -> list[str]:
    """Artifact roots of the embedded default layout (``.../mlflow/artifacts``) that an
    embedded store's experiments record, other than ``root``: those of the home it was
    copied or moved from."""
    import sqlite3

    suffix = "/mlflow/artifacts"
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


def _create_embedded_store(db_path: Path, artifact_root: str | None) -> None:
    """Create the sqlite schema aside and move it into place, so that no process ever sees (and
    no kill ever leaves) a half-migrated store under the real name. Call under :func:`_store_lock`.
    """
    for leftover in db_path.parent.glob(f".{db_path.name}.*.tmp"):
        leftover.unlink(missing_ok=True)  # a creation killed before its rename
    if db_path.exists() and db_path.stat().st_size > 0:
        return  # an empty file holds nothing: it is replaced
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    tmp = db_path.with_name(f".{db_path.name}.{os.getpid()}.tmp")
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", artifact_root or str(db_path.parent))
        store.engine.dispose()
        os.replace(tmp, db_path)
    finally:
        tmp.unlink(missing_ok=True)


def _broken_store_message(db_path: Path, error: BaseException) -> str:
    # busy, read-only, full or too long a path: said as such (moving the store would not help)
    if (line := sqlite_problem(str(error), db_path)) is not None:
        return line
    return (
        f"the MLflow store {db_path} cannot be opened ({type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else ''}).\n"
        "If it was damaged by an older nllab killed while creating it: move it aside, e.g.\n"
        f"  mv {db_path} {db_path}.broken\n"
        "and run the command again (a new, empty store is created; nothing else is deleted)."
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


_ATTACHED: dict[tuple[TrackingSettings, str], Any] = {}
_ATTACHED_LOCK = threading.Lock()
#: The trackers :meth:`_StoreMixin.connect` opened in this process, by what they were opened
#: for, with the identity of the embedded store file they opened (``None`` for a server).
_CONNECTED: dict[tuple[Any, ...], tuple[Any, tuple[int, int] | None]] = {}
_CONNECTED_LOCK = threading.Lock()


def _store_file(settings: TrackingSettings) -> Path | None:
    """The sqlite file of an embedded store; ``None`` for a tracking server."""
    if not settings.is_embedded:
        return None
    return Path(settings.tracking_uri.removeprefix("sqlite:///"))


def _store_identity(settings: TrackingSettings) -> tuple[int, int] | None:
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


class _StoreMixin:
    """Opening the store and the experiment: the connection half of the tracker."""

    settings: TrackingSettings
    client: MlflowClient
    _experiment_id: str | None

    if TYPE_CHECKING:

        def __init__(self, settings: TrackingSettings) -> None: ...
        def end_stale_runs(self, *, stale_after: float = ...) -> list[str]: ...
        def _retire_old_claims_runs(self) -> list[str]: ...

    # -- connection -------------------------------------------------------------------------
    @classmethod
    def connect(cls, config: TrackingConfig | None = None) -> Self:
        """Open (and, for the embedded store, create) the store and the experiment.

        Safe from several threads or processes at once: the embedded sqlite schema is created
        under a file lock, aside, and moved into place complete. Runs left RUNNING by a process
        that is gone are ended KILLED (:meth:`end_stale_runs`). Raises
        :class:`TrackingUnavailable` with what to do when the store cannot be used.

        One connection per process and store: connecting again with the same resolved settings
        (and the same ``NLLAB_HOME`` and ``NLLAB_ARTIFACT_ROOT``) returns the tracker already
        opened, without locking, creating or opening the store again; only a check that its
        experiment is still active and its two queries for leftovers (:meth:`_tidy`) run again,
        which also check that the store still answers. An embedded store whose file was deleted
        or replaced since, a deleted experiment, or a store that no longer answers gets a fresh,
        checked connection (re-created, or refused with what to do).
        """
        settings = TrackingSettings.resolve(config)
        # Registry calls made through the fluent helpers must hit the same store.
        mlflow.set_tracking_uri(settings.tracking_uri)
        mlflow.set_registry_uri(settings.tracking_uri)
        key = (cls, settings, str(data_home()), os.environ.get("NLLAB_ARTIFACT_ROOT"))
        with _CONNECTED_LOCK:
            opened = _CONNECTED.get(key)
        if opened is not None and opened[1] == _store_identity(settings):
            try:
                tracker = opened[0]
                # deleted since (another process, the UI): a fresh connection says what to do
                if tracker.client.get_experiment(tracker.experiment_id).lifecycle_stage == (
                    "active"
                ):
                    tracker._tidy()
                    return tracker
            except Exception:
                pass  # the store no longer answers: a fresh connection says why
        tracker = cls._connect(settings)
        with _CONNECTED_LOCK:
            _CONNECTED[key] = (tracker, _store_identity(settings))
        return tracker

    @classmethod
    def _connect(cls, settings: TrackingSettings) -> Self:
        """A fresh, checked connection (what :meth:`connect` does the first time)."""
        db_path = _store_file(settings)
        if db_path is None:
            tracker = cls._open(settings)
        else:
            with _store_lock(db_path):
                try:
                    _create_embedded_store(db_path, settings.artifact_root)
                except Exception as e:
                    raise TrackingUnavailable(_broken_store_message(db_path, e)) from None
                tracker = cls._open(settings, db_path)
        tracker._tidy()
        return tracker

    def _tidy(self) -> None:
        """Clear what others left in the experiment: the claims runs of older versions
        (:meth:`_retire_old_claims_runs`) and the runs whose process is gone
        (:meth:`end_stale_runs`)."""
        self._retire_old_claims_runs()
        self.end_stale_runs()

    @classmethod
    def _open(cls, settings: TrackingSettings, db_path: Path | None = None) -> Self:
        try:
            tracker = cls(settings)
            tracker._experiment_id = tracker._ensure_experiment()
            tracker._follow_moved_home()
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
        return tracker

    def _follow_moved_home(self) -> None:
        """Keep the home self-contained: point every artifact location the embedded store
        records (absolute paths, as MLflow stores them) at the artifact folder beside it.

        Only for the embedded default layout (this home's own ``mlflow.db``). Any recorded
        root ``<somewhere>/mlflow/artifacts`` other than this home's is rewritten, whether or not
        it still exists: after ``cp -a`` of a home, the copy's new runs, models and registry
        versions then live in the copy, never in the original (which may be deleted without
        losing anything of the copy's). Idempotent, so concurrent processes may both call it.
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
                tags={_KIND_TAG: _KIND_ML},  # the UI's model-training view, not the GenAI one
            )
        except MlflowException:
            # Another process created it between our lookup and create.
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    @classmethod
    def attach(cls, settings: TrackingSettings, experiment_id: str) -> Self:
        """The process's tracker for an experiment that :meth:`connect` already opened.

        Used inside task workers (threads or Dask processes): only settings travel to them.
        """
        key = (settings, experiment_id)
        with _ATTACHED_LOCK:
            if key not in _ATTACHED:
                tracker = cls(settings)
                tracker._experiment_id = experiment_id
                _ATTACHED[key] = tracker
            return _ATTACHED[key]

    def _store_lock(self) -> contextlib.AbstractContextManager[None]:
        """The embedded store's file lock; nothing for a server store."""
        db_path = _store_file(self.settings)
        return contextlib.nullcontext() if db_path is None else _store_lock(db_path)

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            raise RuntimeError("Tracker is not connected; use Tracker.connect()")
        return self._experiment_id
