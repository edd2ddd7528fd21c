"""The one MLflow adapter of the platform: every MLflow call goes through this module.

It uses ``MlflowClient`` with explicit run ids only (no fluent "active run"), so concurrently
running cells in threads can never log into each other's runs. Settings come from the environment,
seeded by ``mlflow.env`` (see :mod:`tasks._env`); the embedded default is a sqlite store and an
artifact folder under ``data_home()/"mlflow"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import mlflow
from mlflow import MlflowClient
from mlflow.entities import (
    Dataset as MlflowDataset,
)
from mlflow.entities import (
    DatasetInput,
    InputTag,
    Metric,
    Param,
    RunTag,
)
from mlflow.exceptions import MlflowException

from datasets import data_home
from tasks.config import CellConfig, TrackingConfig, non_default_overrides

__all__ = [
    "CHAMPION",
    "CLAIM_STALE_AFTER",
    "UI_VIEW_KEY",
    "ParentRun",
    "Promotion",
    "RunRecord",
    "RunTags",
    "Tracker",
    "TrackingSettings",
    "TrackingUnavailable",
    "cell_variant",
    "claim_owner",
    "embedded_tracking_uri",
    "git_commit",
    "parent_run",
    "relocate_artifacts",
    "run_name",
]

CHAMPION = "champion"
RunStatus = Literal["FINISHED", "FAILED", "KILLED"]
# MLflow limits: param values 6000 chars, tag values 8000; a batch holds 1000 metrics / 100 params.
_MAX_TAG = 5000
_PARAM_BATCH = 100
_METRIC_BATCH = 1000


def _stale_after_from_env(default: float = 600.0) -> float:
    try:
        value = float(os.environ.get("NLLAB_CLAIM_STALE_SECONDS") or default)
    except ValueError:
        return default
    return value if value > 0 else default


#: Seconds without a heartbeat after which another process may take over a claimed cell
#: (``NLLAB_CLAIM_STALE_SECONDS`` overrides the 600 s, e.g. for fault probes).
CLAIM_STALE_AFTER = _stale_after_from_env()
#: Tags recording which process owns a run, so a later start can end runs whose process is gone.
_HOST_TAG, _PROC_TAG = "nllab.host", "nllab.process"
_CLAIMS_KIND = "claims"
#: Experiment tags the MLflow UI reads: the experiment's kind (which view it opens on) and a
#: shared view state of its runs page (:meth:`Tracker.set_ui_view`).
_KIND_TAG, _KIND_ML = "mlflow.experimentKind", "custom_model_development"
_SHARED_VIEW_TAG = "mlflow.sharedViewState."
#: The key of the results view of the runs page (``?viewStateShareKey=``).
UI_VIEW_KEY = "nllab-results"
_BOOKKEEPING_PREFIX = "nllab-bookkeeping-"


class RunTags:
    """The names of the run tags the platform writes and reads (one place for every command)."""

    KIND = "nllab.kind"  # benchmark, study:<name>, reproduce, tune, trial, cell
    STUDY = "nllab.study"
    PROFILE = "profile"
    SYSTEM = "system"
    METHOD = "method"
    SEED = "seed"
    CONFIG_HASH = "config_hash"
    DATASET_HASH = "dataset_hash"
    ERROR = "error"
    RESUMED = "resumed"
    SOURCE_RUN = "nllab.source_run_id"
    SOURCE_MODEL = "nllab.source_model"
    EXECUTION_PREFIX = "execution."
    CELLS = "cells"
    CELLS_FINISHED = "cells_finished"
    CELLS_REUSED = "cells_reused"
    CELLS_FAILED = "cells_failed"
    PARENT = "mlflow.parentRunId"
    NOTE = "mlflow.note.content"
    GIT_COMMIT = "mlflow.source.git.commit"


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


def _local_path(uri: str | None) -> Path | None:
    """The folder of a local artifact URI (a plain path or ``file://``), else ``None``."""
    if not uri:
        return None
    if uri.startswith("file://"):
        from mlflow.utils.file_utils import local_file_uri_to_path

        return Path(local_file_uri_to_path(uri))
    return None if ":" in uri.split("/", 1)[0] else Path(uri)


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0] if text else ""


def _host_id() -> str:
    """This host, as pids are meaningful: the host name and (on Linux) the pid namespace, so
    two containers with one host name never judge each other's processes."""
    try:
        ns = os.readlink("/proc/self/ns/pid").removeprefix("pid:")
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()}{ns}"


def _process_token(pid: int) -> str | None:
    """``PID:START`` of a live process on this host (START: its start time in clock ticks since
    boot, from ``/proc``, so a recycled pid does not pass as the old process), or ``None``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return str(pid)  # no /proc (not Linux): the pid alone
    # Field 22 (starttime); the command name (field 2) may hold spaces, so split after ")".
    return f"{pid}:{stat.rsplit(')', 1)[1].split()[19]}"


def _process_alive(token: str) -> bool:
    pid = token.split(":", 1)[0]
    if not pid.isdigit():
        return True  # not ours to judge
    current = _process_token(int(pid))
    if current is None:
        return False
    return ":" not in token or ":" not in current or current == token


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
    if "database is locked" in str(error):
        return (
            f"the MLflow store {db_path} is busy (locked by another process for too long; a "
            "process suspended with Ctrl-Z holds its lock until resumed with `fg`); run the "
            "command again"
        )
    return (
        f"the MLflow store {db_path} cannot be opened ({type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else ''}).\n"
        "If it was damaged by an older nllab killed while creating it: move it aside, e.g.\n"
        f"  mv {db_path} {db_path}.broken\n"
        "and run the command again (a new, empty store is created; nothing else is deleted)."
    )


def claim_owner() -> str:
    """A claim owner naming this process: ``HOST/PID:START/RANDOM`` (unique per call)."""
    token = _process_token(os.getpid()) or str(os.getpid())
    return f"{_host_id()}/{token}/{os.urandom(4).hex()}"


def _owner_gone(owner: str) -> bool:
    """Whether ``owner`` (from :func:`claim_owner`) is a process of this host that has ended."""
    parts = owner.split("/")
    return len(parts) == 3 and parts[0] == _host_id() and not _process_alive(parts[1])


class _Claim(NamedTuple):
    generation: int
    owner: str
    at: float  # when it was claimed (epoch seconds)
    beat: float | None  # the owner's last heartbeat; None once released


def _claim_state_in(claims, config_hash: str) -> _Claim | None:
    """The newest claim on ``config_hash`` in the claims run's data."""
    prefix = f"claim.{config_hash}."
    gens = [int(k[len(prefix) :]) for k in claims.params if k.startswith(prefix)]
    if not gens:
        return None
    g = max(gens)
    record = json.loads(claims.params[f"{prefix}{g}"])
    beat = claims.tags.get(f"{prefix}{g}.beat", repr(record["at"]))
    return _Claim(
        g, record["owner"], float(record["at"]), None if beat == "released" else float(beat)
    )


def _abandoned_cell_run(run, claims, stale_after: float) -> bool:
    """Whether ``run`` is a cell run whose process lost its cell's claim: no heartbeat for
    ``stale_after`` seconds, or the claim taken over by another process since the run began."""
    tags = run.data.tags
    config_hash = tags.get(RunTags.CONFIG_HASH)
    if tags.get(RunTags.KIND) != "cell" or not config_hash:
        return False
    state = _claim_state_in(claims, config_hash)
    if state is None:
        return False
    if state.owner.split("/")[:2] == [tags.get(_HOST_TAG), tags.get(_PROC_TAG)]:
        return state.beat is not None and time.time() - state.beat > stale_after
    return state.at * 1000 > run.info.start_time


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


@dataclass(frozen=True)
class RunRecord:
    """A finished cell found in the store."""

    run_id: str
    config_hash: str
    test_rmse: float | None
    tags: Mapping[str, str]
    metrics: Mapping[str, float] = field(default_factory=dict)
    artifact_uri: str | None = None


@dataclass(frozen=True)
class Promotion:
    """Outcome of a champion check in the model registry."""

    name: str
    promoted: bool
    version: str | None
    test_rmse: float
    previous_rmse: float | None


_ATTACHED: dict[tuple[TrackingSettings, str], Tracker] = {}
_ATTACHED_LOCK = threading.Lock()


class Tracker:
    """Connection to one experiment of one tracking store."""

    def __init__(self, settings: TrackingSettings) -> None:
        self.settings = settings
        self.client = MlflowClient(tracking_uri=settings.tracking_uri)
        self._experiment_id: str | None = None
        self._claims_run_id: str | None = None
        self._dataset_lock = threading.Lock()
        #: run id -> id of the logged model this process logged for it (:meth:`log_model`)
        self._run_models: dict[str, str] = {}

    # -- connection -------------------------------------------------------------------------
    @classmethod
    def connect(cls, config: TrackingConfig | None = None) -> Tracker:
        """Open (and, for the embedded store, create) the store and the experiment.

        Safe from several threads or processes at once: the embedded sqlite schema is created
        under a file lock, aside, and moved into place complete. Runs left RUNNING by a process
        that is gone are ended KILLED (:meth:`end_stale_runs`). Raises
        :class:`TrackingUnavailable` with what to do when the store cannot be used.
        """
        settings = TrackingSettings.resolve(config)
        # Registry calls made through the fluent helpers must hit the same store.
        mlflow.set_tracking_uri(settings.tracking_uri)
        mlflow.set_registry_uri(settings.tracking_uri)
        if not settings.is_embedded:
            tracker = cls._open(settings)
        else:
            db_path = Path(settings.tracking_uri.removeprefix("sqlite:///"))
            with _store_lock(db_path):
                try:
                    _create_embedded_store(db_path, settings.artifact_root)
                except Exception as e:
                    raise TrackingUnavailable(_broken_store_message(db_path, e)) from None
                tracker = cls._open(settings, db_path)
        tracker._retire_old_claims_runs()
        tracker.end_stale_runs()
        return tracker

    @classmethod
    def _open(cls, settings: TrackingSettings, db_path: Path | None = None) -> Tracker:
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
    def attach(cls, settings: TrackingSettings, experiment_id: str) -> Tracker:
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
        if not self.settings.is_embedded:
            return contextlib.nullcontext()
        return _store_lock(Path(self.settings.tracking_uri.removeprefix("sqlite:///")))

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            raise RuntimeError("Tracker is not connected; use Tracker.connect()")
        return self._experiment_id

    # -- runs -------------------------------------------------------------------------------
    def create_run(
        self, name: str, tags: Mapping[str, str], parent_run_id: str | None = None
    ) -> str:
        all_tags = {
            **{k: str(v) for k, v in tags.items()},
            RunTags.GIT_COMMIT: git_commit(),
        }
        if parent_run_id is not None:
            all_tags[RunTags.PARENT] = parent_run_id
        all_tags[_HOST_TAG] = _host_id()
        all_tags[_PROC_TAG] = _process_token(os.getpid()) or str(os.getpid())
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def end_run(self, run_id: str, status: RunStatus) -> None:
        self.client.set_terminated(run_id, status=status)

    @contextmanager
    def run(
        self, name: str, tags: Mapping[str, str], parent_run_id: str | None = None
    ) -> Iterator[str]:
        """A run that ends FINISHED only if the block completes.

        An exception ends it FAILED with the error as tag ``error``; Ctrl-C or an interruption
        (exceptions named ``*Interrupted``) ends it KILLED. The exception propagates.
        """
        run_id = self.create_run(name, tags, parent_run_id)
        try:
            yield run_id
        except BaseException as e:
            self.end_with_error(run_id, e)
            raise
        self.end_run(run_id, "FINISHED")

    def end_with_error(self, run_id: str, error: BaseException) -> None:
        """End ``run_id`` because of ``error`` (its tag ``error``): KILLED for Ctrl-C or an
        interruption (exceptions named ``*Interrupted``), FAILED for anything else."""
        interrupted = isinstance(error, KeyboardInterrupt) or type(error).__name__.endswith(
            "Interrupted"
        )
        try:
            self.set_tags(run_id, {RunTags.ERROR: f"{type(error).__name__}: {error}"[:_MAX_TAG]})
        finally:
            self.end_run(run_id, "KILLED" if interrupted else "FAILED")

    def set_tags(self, run_id: str, tags: Mapping[str, object]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_params(self, run_id: str, params: Mapping[str, object]) -> None:
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), _PARAM_BATCH):
            self.client.log_batch(run_id, params=items[i : i + _PARAM_BATCH])

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: int | None = None
    ) -> None:
        ts = int(time.time() * 1000)
        # Metrics logged after the run's model are linked to it (the UI's Models tab).
        model_id = self._run_models.get(run_id)
        items = [Metric(k, float(v), ts, step or 0, model_id=model_id) for k, v in metrics.items()]
        for i in range(0, len(items), _METRIC_BATCH):
            self.client.log_batch(run_id, metrics=items[i : i + _METRIC_BATCH])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        p = Path(path)
        if p.is_dir():
            self.client.log_artifacts(run_id, str(p), artifact_path)
        else:
            self.client.log_artifact(run_id, str(p), artifact_path)

    def log_model(self, run_id: str, folder: str | Path, artifact_path: str = "model") -> str:
        """Log a saved model (the folder of :func:`tasks.modelio.save_model`) as an MLflow 3
        *logged model* of the run, with the ``pyfunc`` flavour's own
        logging: an ``MLmodel`` with a tensor signature and an input example, the model code of
        :mod:`tasks.pyfunc_model` (no pickle) and the weights as its ``weights`` artifact.
        ``predict({"obs_t", "obs_x", "query_t"})`` returns the extrapolation.

        The model carries the run's params, and metrics the run logs afterwards (``test_rmse``)
        are linked to it (:meth:`log_metrics`), so the experiment's Models tab lists it with its
        score, named after the cell (``neural_laplace-integro_de-s0``; ``artifact_path`` for a
        run without those tags). Returns the logged model's id (``models:/<id>`` loads it), which
        ``runs:/<run id>/<artifact_path>`` also reaches."""
        from importlib.metadata import PackageNotFoundError, version

        import numpy as np
        from mlflow.entities import LoggedModelStatus
        from mlflow.models import Model, ModelSignature
        from mlflow.types.schema import Schema, TensorSpec

        folder = Path(folder)
        spec = json.loads((folder / "model.json").read_text())
        dim = int(spec["state_dim"])
        f64 = np.dtype("float64")
        signature = ModelSignature(
            inputs=Schema(
                [
                    TensorSpec(f64, (-1, -1), "obs_t"),
                    TensorSpec(f64, (-1, -1, dim), "obs_x"),
                    TensorSpec(f64, (-1, -1), "query_t"),
                ]
            ),
            outputs=Schema([TensorSpec(f64, (-1, -1, dim))]),
        )
        # One trajectory of 8 observed points (the training set's mean state) and 4 queries
        # after them: small, in physical units, and checked by MLflow against the model.
        mean = np.asarray(spec.get("normaliser", {}).get("mean", [0.0] * dim), dtype=f64)
        example = {
            "obs_t": np.linspace(0.0, 1.0, 8)[None],
            "obs_x": np.broadcast_to(mean.reshape(1, 1, -1), (1, 8, dim)).copy(),
            "query_t": np.linspace(1.25, 2.0, 4)[None],
        }
        requirements = []
        for package in ("torch", "numpy", "neural-laplace-lab"):
            try:
                requirements.append(f"{package}=={version(package)}")
            except PackageNotFoundError:
                requirements.append(package)
        run = self.client.get_run(run_id)
        cell = [run.data.tags.get(k) for k in ("method", "system", "seed")]
        name = f"{cell[0]}-{cell[1]}-s{cell[2]}" if all(cell) else artifact_path
        logged = self.client.create_logged_model(
            self.experiment_id,
            name=name.replace(".", "_"),  # MLflow refuses / : . % and quotes in a model's name
            source_run_id=run_id,
            params=dict(run.data.params),
            tags={k: run.data.tags[k] for k in ("system", "method", "seed") if k in run.data.tags},
            model_type=str(spec.get("method", "")) or None,
        )
        code = Path(__file__).resolve().parent.parent / "pyfunc_model.py"
        with tempfile.TemporaryDirectory(prefix="nllab-pyfunc-") as tmp:
            # MLflow keeps an artifact folder's own name: copy it as "weights".
            weights = shutil.copytree(folder, Path(tmp) / "weights")
            # The pyfunc flavour's own logging (what mlflow.pyfunc.log_model runs), with the
            # run named explicitly: cells log from worker threads, which have no active run.
            # It links the model to the run and sets the MLmodel's run_id.
            mlflow.set_tracking_uri(self.settings.tracking_uri)
            # MLflow reports, past any filter, that it cannot turn the dict-of-arrays hint into
            # a signature (it takes list[...] hints only): the signature is given, so that
            # report is dropped and any other warning shown as usual.
            with warnings.catch_warnings(record=True) as caught:
                Model.log(
                    None,  # artifact_path: MLflow 3 names a model by ``name``
                    name=logged.name,
                    flavor=mlflow.pyfunc,
                    run_id=run_id,
                    model_id=logged.model_id,
                    python_model=str(code),
                    artifacts={"weights": str(weights)},
                    signature=signature,
                    input_example=example,
                    pip_requirements=requirements,
                )
        for w in caught:
            if not str(w.message).startswith("Failed to infer signature from type hint"):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        self.client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        self._run_models[run_id] = logged.model_id
        return logged.model_id

    def logged_model_id(self, run_id: str) -> str | None:
        """The id of the run's logged model (the newest; a cell logs one), or ``None`` (a run
        from before models were logged as MLflow 3 logged models keeps its model as artifacts)."""
        if run_id in self._run_models:
            return self._run_models[run_id]
        found = self.client.search_logged_models(
            [self.experiment_id],
            filter_string=f"source_run_id = '{run_id}'",
            order_by=[{"field_name": "creation_timestamp", "ascending": False}],
            max_results=1,
        )
        return found[0].model_id if found else None

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def log_dataset(
        self,
        run_id: str,
        *,
        name: str,
        digest: str,
        source: str,
        profile: Mapping[str, object],
        context: str = "training",
    ) -> None:
        """Record a data set as an MLflow dataset input of the run."""
        ds = MlflowDataset(
            name=name,
            digest=digest[:36],
            source_type="local",
            source=json.dumps({"uri": source}),
            profile=json.dumps(dict(profile)),
        )
        inputs = [DatasetInput(ds, tags=[InputTag("mlflow.data.context", context)])]
        # The first run to log a data set creates its row; a writer racing it (another cell,
        # another process) hits the unique constraint once and then just links the row.
        with self._dataset_lock:
            try:
                self.client.log_inputs(run_id, datasets=inputs)
            except MlflowException:
                time.sleep(0.2)
                self.client.log_inputs(run_id, datasets=inputs)

    def get_run_data(self, run_id: str):
        """Status, tags, params and latest metrics of a run (``mlflow.entities.Run``)."""
        return self.client.get_run(run_id)

    def download(self, run_id: str, path: str, dst: str | Path) -> Path:
        """Download a run artifact; ``"model"`` is the run's logged model (or, for a run from
        before models were logged so, its ``model`` artifact folder)."""
        model_id = self.logged_model_id(run_id) if path.strip("/") == "model" else None
        if model_id is None:
            return Path(self.client.download_artifacts(run_id, path, str(dst)))
        return Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{model_id}",
                dst_path=str(dst),
                tracking_uri=self.settings.tracking_uri,
            )
        )

    def end_stale_runs(self, *, stale_after: float = CLAIM_STALE_AFTER) -> list[str]:
        """End KILLED every RUNNING run of the experiment that can never finish; their ids.

        Each run records its host and process when created (tags ``nllab.host`` and
        ``nllab.process``: pid and start time, so a recycled pid does not count as alive). A run
        started on this host by a process that no longer exists can never finish (``kill -9``,
        a power cut). Processes of other hosts cannot be asked, so a cell run of another host
        counts as abandoned through its cell's claim: its process stopped heart-beating for
        ``stale_after`` seconds, or another process took the claim over after the run started
        (a Dask worker killed mid-cell, its cell trained again elsewhere). Runs of live
        processes, and runs of other hosts that hold no claim (parents, tuning trials), are
        left alone.
        """
        host = _host_id()
        claims = None
        ended = []
        for r in list(self._search("attributes.status = 'RUNNING'")):
            tags = r.data.tags
            token = tags.get(_PROC_TAG)
            if not token:
                continue
            if tags.get(_HOST_TAG) == host:
                if _process_alive(token):
                    continue
            else:
                claims = claims if claims is not None else self._claims_data()
                if not _abandoned_cell_run(r, claims, stale_after):
                    continue
            self.set_tags(
                r.info.run_id, {RunTags.ERROR: f"process {token} ended without closing this run"}
            )
            self.end_run(r.info.run_id, "KILLED")
            ended.append(r.info.run_id)
        return ended

    def end_runs_of_process(self, pid: int, error: str, status: RunStatus = "FAILED") -> list[str]:
        """End ``status`` (tag ``error``) every RUNNING run that process ``pid`` of this host
        created, e.g. a worker process that died mid-cell; their ids."""
        host, ended = _host_id(), []
        for r in list(self._search("attributes.status = 'RUNNING'")):
            tags = r.data.tags
            if tags.get(_HOST_TAG) == host and tags.get(_PROC_TAG, "").split(":")[0] == str(pid):
                self.set_tags(r.info.run_id, {RunTags.ERROR: error[:_MAX_TAG]})
                self.end_run(r.info.run_id, status)
                ended.append(r.info.run_id)
        return ended

    # -- cell claims ------------------------------------------------------------------------
    # A claim on a config hash is the param ``claim.<hash>.<generation>`` of one "claims" run.
    # Params are write-once in every MLflow store (a second value for the same key is refused by
    # the database's unique key), so exactly one owner wins each generation, on sqlite, Postgres
    # or a tracking server alike. The tag ``claim.<hash>.<generation>.beat`` holds the owner's
    # latest heartbeat (epoch seconds) or ``released``; a stale or released generation is taken
    # over by claiming the next one. The generation is the claim's fencing token: a holder writes
    # a cell's final state only while its generation is still the newest (:meth:`holds_cell`).
    #
    # The claims run lives in a bookkeeping experiment of its own (``nllab-bookkeeping-<id>``, one
    # per experiment), so a user browsing the experiment's runs never sees it; every host of a
    # shared tracking server finds it by that name.

    def _bookkeeping_experiment(self) -> str:
        name = f"{_BOOKKEEPING_PREFIX}{self.experiment_id}"
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        note = (
            f"nllab bookkeeping of experiment {self.settings.experiment!r} (id "
            f"{self.experiment_id}): cell claims and heartbeats. No results here; it is kept out "
            "of the experiment's run list on purpose. Do not delete it while nllab runs."
        )
        try:
            return self.client.create_experiment(
                name,
                artifact_location=self.settings.artifact_root,
                tags={RunTags.NOTE: note, RunTags.KIND: "bookkeeping"},
            )
        except MlflowException:
            exp = self.client.get_experiment_by_name(name)  # created meanwhile by another
            if exp is None:
                raise
            return exp.experiment_id

    def _claims_run(self) -> str:
        if self._claims_run_id is None:
            query = f"tags.`nllab.kind` = '{_CLAIMS_KIND}'"
            exp_id = self._bookkeeping_experiment()
            runs = self.client.search_runs([exp_id], query, max_results=100)
            if not runs:
                with self._store_lock():
                    runs = self.client.search_runs([exp_id], query, max_results=100)
                    if not runs:
                        run = self.client.create_run(
                            exp_id, run_name="nllab-claims", tags={RunTags.KIND: _CLAIMS_KIND}
                        )
                        self.end_run(run.info.run_id, "FINISHED")  # bookkeeping, never "running"
                        runs = self.client.search_runs([exp_id], query, max_results=100)
            # Processes of a server store that create it at once settle on the oldest one.
            first = min(runs, key=lambda r: (r.info.start_time, r.info.run_id))
            self._claims_run_id = first.info.run_id
        return self._claims_run_id

    def _retire_old_claims_runs(self) -> list[str]:
        """Delete (MLflow's soft delete: hidden, restorable) the claims runs that older versions
        kept in the experiment itself; their claims are ignored (a cell claimed only there can be
        claimed again at once). Their ids."""
        old = [r.info.run_id for r in self._search(f"tags.`nllab.kind` = '{_CLAIMS_KIND}'")]
        for run_id in old:
            with contextlib.suppress(MlflowException):  # deleted meanwhile by another process
                self.client.delete_run(run_id)
        return old

    def _claims_data(self):
        return self.client.get_run(self._claims_run()).data

    def _claim_state(self, config_hash: str) -> _Claim | None:
        """The newest claim on ``config_hash``, or ``None``."""
        return _claim_state_in(self._claims_data(), config_hash)

    def _beat(self, config_hash: str, generation: int, value: str) -> None:
        self.set_tags(self._claims_run(), {f"claim.{config_hash}.{generation}.beat": value})

    def claim_cell(
        self, config_hash: str, owner: str, *, stale_after: float = CLAIM_STALE_AFTER
    ) -> bool:
        """Claim the cell ``config_hash`` for ``owner`` (see :func:`claim_owner`); ``True`` if
        ``owner`` now holds it (also when it already did), ``False`` if another owner does.

        A claim is taken over when it was released, its owner's last heartbeat is older than
        ``stale_after`` seconds, or its owner is a process of this host that no longer exists.
        Of several owners claiming at once exactly one gets ``True``. The holder calls
        :meth:`heartbeat_cell` more often than every ``stale_after`` seconds while it works,
        and :meth:`release_cell` at the end (or uses :meth:`cell_claim`).
        """
        state = self._claim_state(config_hash)
        generation = 0
        if state is not None:
            if state.beat is not None:
                if state.owner == owner:
                    self._beat(config_hash, state.generation, repr(time.time()))
                    return True
                if time.time() - state.beat < stale_after and not _owner_gone(state.owner):
                    return False
            generation = state.generation + 1
        key = f"claim.{config_hash}.{generation}"
        try:
            self.client.log_param(
                self._claims_run(), key, json.dumps({"owner": owner, "at": time.time()})
            )
        except MlflowException:
            # Refused: someone claimed this generation first (anything else is re-raised).
            state = self._claim_state(config_hash)
            if state is None or state.generation < generation:
                raise
            return state.generation == generation and state.owner == owner
        return True

    def heartbeat_cell(self, config_hash: str, owner: str) -> bool:
        """Renew ``owner``'s claim; ``False`` if it no longer holds it (taken over, released)."""
        state = self._claim_state(config_hash)
        if state is None or state.owner != owner or state.beat is None:
            return False
        self._beat(config_hash, state.generation, repr(time.time()))
        return True

    def holds_cell(self, config_hash: str, owner: str, generation: int | None = None) -> bool:
        """The fence before a cell's final write: whether ``owner`` still holds the newest claim
        on ``config_hash`` (of ``generation``, the fencing token of :meth:`claim_generation`,
        when given); if so the claim's heartbeat is renewed, so that no other process can take it
        over for the next ``stale_after`` seconds.

        A holder suspended (``SIGSTOP``, a laptop lid) past the stale time may have lost its
        claim to a process that trained the cell meanwhile: it must then not log the cell as
        FINISHED (which would give one config hash two finished runs).
        """
        state = self._claim_state(config_hash)
        if state is None or state.owner != owner or state.beat is None:
            return False
        if generation is not None and state.generation != generation:
            return False
        self._beat(config_hash, state.generation, repr(time.time()))
        return True

    def claim_generation(self, config_hash: str, owner: str) -> int | None:
        """The generation (fencing token) of ``owner``'s live claim on ``config_hash``, or
        ``None`` if it holds none."""
        state = self._claim_state(config_hash)
        if state is None or state.owner != owner or state.beat is None:
            return None
        return state.generation

    def claim_holder(self, config_hash: str) -> str | None:
        """Who holds the claim on ``config_hash``, for people: ``pid P on host H since T``
        (``T`` in UTC), or ``None`` when nobody holds it."""
        state = self._claim_state(config_hash)
        if state is None or state.beat is None:
            return None
        parts = state.owner.split("/")
        host = parts[0].split("[", 1)[0] if parts else state.owner
        pid = parts[1].split(":", 1)[0] if len(parts) > 1 else "?"
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(state.at))
        return f"pid {pid} on host {host} since {since}"

    def release_cell(self, config_hash: str, owner: str) -> None:
        """Give up ``owner``'s claim (no-op if it does not hold it)."""
        state = self._claim_state(config_hash)
        if state is not None and state.owner == owner and state.beat is not None:
            self._beat(config_hash, state.generation, "released")

    @contextmanager
    def cell_claim(
        self,
        config_hash: str,
        owner: str,
        *,
        stale_after: float = CLAIM_STALE_AFTER,
        interval: float | None = None,
    ) -> Iterator[bool]:
        """``with tracker.cell_claim(h, owner) as mine:`` :meth:`claim_cell`, then (if ``mine``)
        a heartbeat every ``interval`` seconds (default ``stale_after / 4``) in a daemon thread
        while the block runs, and :meth:`release_cell` when it ends, however it ends."""
        if not self.claim_cell(config_hash, owner, stale_after=stale_after):
            yield False
            return
        done = threading.Event()

        def beat() -> None:
            while not done.wait(interval or stale_after / 4):
                with contextlib.suppress(Exception):  # a missed beat is retried next time
                    if not self.heartbeat_cell(config_hash, owner):
                        return

        thread = threading.Thread(target=beat, name=f"claim-{config_hash[:8]}", daemon=True)
        thread.start()
        try:
            yield True
        finally:
            done.set()
            thread.join()
            self.release_cell(config_hash, owner)

    # -- queries ----------------------------------------------------------------------------
    def _search(self, filter_string: str, order_by: list[str] | None = None) -> Iterator:
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

    def finished_cells(self, hashes: Iterable[str]) -> dict[str, RunRecord]:
        """Finished cell runs with one of these config hashes (the newest per hash)."""
        return self.reusable_cells(hashes, check_model=False)[0]

    def reusable_cells(
        self, hashes: Iterable[str], *, check_model: bool = True
    ) -> tuple[dict[str, RunRecord], dict[str, tuple[RunRecord, str]]]:
        """``(reusable, unusable)``: per config hash, the newest finished cell run whose model
        artifact is present and loads (:meth:`model_problem`); and, for hashes that have
        finished runs but none with a usable model, the newest such run and what is wrong
        with it (the cell must be trained again). ``check_model=False``: any finished run."""
        wanted = set(hashes)
        found: dict[str, RunRecord] = {}
        broken: dict[str, tuple[RunRecord, str]] = {}
        runs = self._search(
            "tags.`nllab.kind` = 'cell' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"],
        )
        for r in runs:
            h = r.data.tags.get(RunTags.CONFIG_HASH)
            if h not in wanted or h in found:
                continue
            record = RunRecord(
                r.info.run_id,
                h,
                r.data.metrics.get("test_rmse"),
                dict(r.data.tags),
                dict(r.data.metrics),
                r.info.artifact_uri,
            )
            problem = self.model_problem(record) if check_model else None
            if problem is None:
                found[h] = record
                broken.pop(h, None)
            else:
                broken.setdefault(h, (record, problem))
        return found, broken

    def model_problem(self, record: RunRecord, artifact_path: str = "model") -> str | None:
        """Why the model logged by a finished cell run cannot be used, or ``None`` when it is
        present and loads. Local artifacts are loaded (:func:`tasks.modelio.load_model`: the
        weights read back into the model); a remote artifact store is only listed."""
        uri = record.artifact_uri or self.client.get_run(record.run_id).info.artifact_uri
        local = _local_path(uri)
        if local is None:
            try:
                listed = self.client.list_artifacts(record.run_id, artifact_path)
            except Exception as e:
                return f"its model cannot be listed ({type(e).__name__}: {_first_line(e)})"
            if listed or self._remote_logged_model(record.run_id):
                return None
            return f"its model is missing from the artifact store ({uri}/{artifact_path})"
        from tasks.modelio import load_model

        folder = local / artifact_path
        if not folder.is_dir():
            logged = self._logged_model_folders(record.run_id)
            if not logged:
                return f"its model folder {folder} is missing"
            folder = logged[0]
        try:
            load_model(folder)
        except Exception as e:
            return f"its model at {folder} does not load ({type(e).__name__}: {_first_line(e)})"
        return None

    def _remote_logged_model(self, run_id: str) -> bool:
        """Whether the run's MLflow 3 logged model lists its ``MLmodel`` in a remote artifact
        store (an ``mlflow-artifacts:`` server, an object store): listed, not loaded."""
        try:
            model_id = self.logged_model_id(run_id)
            if model_id is None:
                return False
            files = self.client.list_logged_model_artifacts(model_id)
        except Exception:
            return False
        return any(f.path == "MLmodel" for f in files)

    def _logged_model_folders(self, run_id: str) -> list[Path]:
        """Local artifact folders of MLflow 3 logged models whose source is ``run_id``."""
        try:
            models = self.client.search_logged_models(
                [self.experiment_id], filter_string=f"source_run_id = '{run_id}'"
            )
        except Exception:
            return []
        paths = [_local_path(m.artifact_location) for m in models]
        return [p for p in paths if p is not None and p.is_dir()]

    def child_runs(self, parent_run_id: str) -> list:
        return list(self._search(f"tags.`mlflow.parentRunId` = '{parent_run_id}'"))

    def latest_run(self, kind: str) -> str | None:
        """The newest FINISHED run of ``kind`` (a failed or interrupted one has no results)."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`nllab.kind` = '{kind}' and attributes.status = 'FINISHED'",
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        return runs[0].info.run_id if runs else None

    def finished_runs(self, kind: str) -> list:
        """Every FINISHED run of ``kind``, newest first (``mlflow.entities.Run``)."""
        return list(
            self._search(
                f"tags.`nllab.kind` = '{kind}' and attributes.status = 'FINISHED'",
                order_by=["attributes.start_time DESC"],
            )
        )

    def set_ui_view(self) -> str:
        """Make the MLflow UI open this experiment as a model-training one, with the results in
        view; returns the key of the saved view (the runs page's ``viewStateShareKey``).

        Two experiment tags, which the UI reads: ``mlflow.experimentKind`` (a model-training
        experiment, not a GenAI one) and a shared view state (what the UI's *Share* button
        saves) whose run table shows ``test_rmse``, the best validation RMSE, epochs and
        training time beside the system and method. Which sidebar a page opened without
        ``workflowType`` shows and the plain page's columns are the browser's own choices
        (MLflow keeps them in its local storage); charts are left to the user."""
        columns = [
            "attributes.`Models`",
            "attributes.`Dataset`",
            "tags.`system`",
            "tags.`method`",
            "tags.`seed`",
            "metrics.`test_rmse`",
            "metrics.`best_val_rmse`",
            "metrics.`epochs_run`",
            "metrics.`train_seconds`",
        ]
        view = {"selectedColumns": columns, "columnOrder": columns}
        self.client.set_experiment_tag(self.experiment_id, _KIND_TAG, _KIND_ML)
        self.client.set_experiment_tag(
            self.experiment_id, _SHARED_VIEW_TAG + UI_VIEW_KEY, json.dumps(view)
        )
        return UI_VIEW_KEY

    def run_url(self, ui_address: str, run_id: str) -> str:
        """The run's page in the MLflow UI served at ``ui_address``."""
        return f"{ui_address.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}"

    # -- model registry ---------------------------------------------------------------------
    def promote_if_better(
        self, name: str, run_id: str, test_rmse: float, artifact_path: str = "model"
    ) -> Promotion:
        """Register ``run_id``'s model as a new version of ``name`` and move the champion alias
        to it, only if it beats the current champion's test RMSE (lower is better).

        The registry never points at nothing: a deleted run (or one whose model is gone) is
        never promoted, and a champion whose run was deleted (soft or purged) or whose model is
        gone is replaced by any usable run, even one of equal RMSE. Existing versions are never
        deleted or overwritten, and a run already registered under ``name`` (say, by a process
        killed before it moved the alias) is not registered again: its version is reused.
        """
        if self.run_problem(run_id, artifact_path) is not None:
            return Promotion(name, False, None, test_rmse, None)
        try:
            self.client.create_registered_model(
                name, description="Best Neural Laplace model of this system (lowest test RMSE)."
            )
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        aliases = self.client.get_registered_model(name).aliases
        previous: float | None = None
        if CHAMPION in aliases:
            current = self.client.get_model_version(name, aliases[CHAMPION])
            if current.run_id == run_id:
                return Promotion(name, False, str(current.version), test_rmse, test_rmse)
            previous = float(current.tags.get("test_rmse", "inf"))
            gone = current.run_id and self.run_problem(current.run_id, artifact_path)
            if not gone and not test_rmse < previous:
                return Promotion(name, False, None, test_rmse, previous)
        same_run = self.client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
        if same_run:
            version = str(min(int(v.version) for v in same_run))
        else:
            version = str(self._register(name, run_id, artifact_path, test_rmse))
        self.client.set_registered_model_alias(name, CHAMPION, version)
        return Promotion(name, True, version, test_rmse, previous)

    def run_problem(
        self, run_id: str, artifact_path: str = "model", *, allow_deleted: bool = False
    ) -> str | None:
        """Why ``run_id``'s model cannot serve (its run deleted, unless ``allow_deleted``;
        purged; or its model gone), or ``None``."""
        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return f"its run {run_id} no longer exists (deleted and purged)"
        if run.info.lifecycle_stage == "deleted" and not allow_deleted:
            return f"its run {run_id} is deleted"
        record = RunRecord(run_id, "", None, {}, {}, run.info.artifact_uri)
        return self.model_problem(record, artifact_path)

    def _register(self, name: str, run_id: str, artifact_path: str, test_rmse: float) -> str:
        """A new version of ``name`` pointing at the run's logged model (``models:/<id>``), or,
        for a run whose model is only run artifacts, at ``runs:/<run id>/<artifact_path>``."""
        model_id = self.logged_model_id(run_id)
        mv = self.client.create_model_version(
            name,
            source=f"models:/{model_id}" if model_id else f"runs:/{run_id}/{artifact_path}",
            run_id=run_id,
            tags={"test_rmse": repr(float(test_rmse))},
            model_id=model_id,
        )
        return str(mv.version)

    def champion(self, name: str) -> tuple[str, str] | None:
        """``(version, run_id)`` of the champion of ``name``, or ``None``."""
        try:
            mv = self.client.get_model_version_by_alias(name, CHAMPION)
        except MlflowException:
            return None
        return str(mv.version), mv.run_id

    def model_version(self, uri: str) -> tuple[str, str, str | None]:
        """``(name, version, source run id)`` of ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``.

        Raises ``LookupError`` naming the registered models when there is no such version.
        """
        ref = uri.removeprefix("models:/") if uri.startswith("models:/") else ""
        if not ref.strip("/"):
            raise LookupError(
                "expected a registry URI 'models:/NAME@ALIAS' or 'models:/NAME/VERSION', "
                f"got {uri!r}"
            )
        if "@" not in ref and "/" not in ref:
            raise LookupError(
                f"{uri!r} names no version: use models:/{ref}@champion or models:/{ref}/1"
            )
        try:
            if "@" in ref:
                mv = self.client.get_model_version_by_alias(*ref.split("@", 1))
            else:
                mv = self.client.get_model_version(*ref.rsplit("/", 1))
        except MlflowException as e:
            names = sorted(m.name for m in self.client.search_registered_models())
            raise LookupError(
                f"no registered model version at {uri!r} in {self.settings.tracking_uri} "
                f"({e.message.splitlines()[0]}); registered models: {', '.join(names) or 'none'}"
            ) from None
        return mv.name, str(mv.version), mv.run_id

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of a logged metric, in step order."""
        return sorted((m.step, float(m.value)) for m in self.client.get_metric_history(run_id, key))

    def download_model(self, uri: str, dst: str | Path | None = None) -> Path:
        """Download a registered model (``models:/name@alias`` or ``models:/name/version``)."""
        if not uri.startswith("models:/"):
            raise ValueError(
                f"models are loaded only from the registry: expected 'models:/NAME@ALIAS' or "
                f"'models:/NAME/VERSION', got {uri!r}"
            )
        dst = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix="nllab-model-"))
        try:
            path = mlflow.artifacts.download_artifacts(
                artifact_uri=uri,
                dst_path=str(dst),
                tracking_uri=self.settings.tracking_uri,
                registry_uri=self.settings.tracking_uri,
            )
        except MlflowException as e:
            raise LookupError(f"no registered model at {uri!r}: {e.message}") from e
        return Path(path)


@dataclass(frozen=True)
class ParentRun:
    """An open parent run of a command: the run id and the tracker that logs into it."""

    tracker: Tracker
    run_id: str

    def record_cells(self, results: Iterable[Any], *, note: str | None = None) -> None:
        """Tag how the command's cells ended (``cells``, ``cells_finished|reused|failed``)
        and, with ``note``, the run's description shown on its MLflow page."""
        results = list(results)
        statuses = [r.status for r in results]
        tags: dict[str, object] = {
            RunTags.CELLS: len(results),
            RunTags.CELLS_FINISHED: statuses.count("finished"),
            RunTags.CELLS_REUSED: statuses.count("reused"),
            RunTags.CELLS_FAILED: sum(not r.ok for r in results),
        }
        if note is not None:
            tags[RunTags.NOTE] = note[:_MAX_TAG]
        self.tracker.set_tags(self.run_id, tags)


@contextmanager
def parent_run(
    tracker: Tracker,
    name: str,
    *,
    kind: str,
    params: Mapping[str, object] | None = None,
    tags: Mapping[str, object] | None = None,
    execution: Mapping[str, object] | None = None,
    config_json: tuple[str, str] | None = None,
    source_run_id: str | None = None,
    resume: str | None = None,
) -> Iterator[ParentRun]:
    """The parent run of one command (benchmark, study, reproduce, tune), every command alike.

    It is tagged with its ``kind`` and ``tags``, logs ``params``, the execution settings as
    ``execution.*`` tags (how it ran, not what: they are not part of any config hash) and
    ``config_json`` (text, artifact file name). ``source_run_id`` nests it under another run;
    ``resume`` reopens a recorded run instead of creating one. The run ends FINISHED only if the
    block completes; otherwise as :meth:`Tracker.run` ends it.
    """
    all_tags = {RunTags.KIND: kind, **{k: str(v) for k, v in (tags or {}).items()}}
    if resume is None:
        run_id = tracker.create_run(name, all_tags, source_run_id)
    else:
        run_id = resume
        tracker.set_tags(run_id, {**all_tags, RunTags.RESUMED: "true"})
    try:
        if params:
            tracker.log_params(run_id, params)
        if execution:
            tracker.set_tags(
                run_id, {f"{RunTags.EXECUTION_PREFIX}{k}": v for k, v in execution.items()}
            )
        if config_json is not None:
            tracker.log_text(run_id, config_json[0], config_json[1])
        yield ParentRun(tracker, run_id)
    except BaseException as e:
        tracker.end_with_error(run_id, e)
        raise
    tracker.end_run(run_id, "FINISHED")


def run_name(cell: CellConfig, variant: str | None = None) -> str:
    """The MLflow run name of a cell: method and variant first, so runs read apart in the UI's
    truncated name column: ``neural_laplace · lotka_volterra_dde · s0 · stereographic=False``.
    ``variant`` defaults to :func:`cell_variant`."""
    variant = cell_variant(cell) if variant is None else variant
    parts = [cell.method, cell.system, f"s{cell.seed}"]
    if variant:
        parts.append(variant)
    return " · ".join(parts)


def cell_variant(cell: CellConfig) -> str:
    """What sets a cell apart from its model's defaults and clean data, e.g.
    ``latent_dim=4, noise_std=0.1`` (empty for a plain cell)."""
    parts = [
        f"{k}={json.dumps(v) if isinstance(v, list | tuple) else v}"
        for k, v in non_default_overrides(cell.method, cell.model).items()
    ]
    data = cell.data
    for name in ("noise_std", "n_train", "n_observed"):
        value = getattr(data, name)
        if value:
            parts.append(f"{name}={value}")
    return ", ".join(parts)
