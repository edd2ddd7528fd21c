"""Opening the tracking store: :func:`connect` (a command; once per process and store) and
:func:`attach` (a task worker, given the settings and experiment id the command opened) build
the :class:`Tracking` objects, each holding its own handle on the one :class:`Store`."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from datasets import data_home
from tasks.config import TrackingConfig
from tasks.tracking._claims import CellClaims
from tasks.tracking._queries import Queries
from tasks.tracking._registry import Registry
from tasks.tracking._runs import RunLog
from tasks.tracking._store import Store, TrackingSettings, point_mlflow_at, store_identity

__all__ = ["Tracking", "attach", "connect"]


@dataclass(frozen=True)
class Tracking:
    """The tracking objects of one experiment of one store; a caller passes on only the one
    it needs: the cell path :attr:`runs` and :attr:`claims`, reporting :attr:`queries`,
    promotion :attr:`registry`."""

    store: Store
    runs: RunLog
    claims: CellClaims
    queries: Queries
    registry: Registry

    @classmethod
    def over(cls, store: Store) -> Tracking:
        queries = Queries(store)
        return cls(store, RunLog(store), CellClaims(store), queries, Registry(store, queries))

    @property
    def experiment_id(self) -> str:
        return self.store.experiment_id

    def tidy(self) -> None:
        """Clear what others left in the experiment: the claims runs of older versions and the
        runs whose process is gone (:meth:`CellClaims.end_stale_runs`)."""
        self.claims.retire_old_claims_runs()
        self.claims.end_stale_runs()


#: What :func:`connect` opened in this process, by what it was opened for, with the identity of
#: the embedded store file it opened (``None`` for a server).
_CONNECTED: dict[tuple[object, ...], tuple[Tracking, tuple[int, int] | None]] = {}
_CONNECTED_LOCK = threading.Lock()
_ATTACHED: dict[tuple[TrackingSettings, str], Tracking] = {}
_ATTACHED_LOCK = threading.Lock()


def connect(config: TrackingConfig | None = None) -> Tracking:
    """Open (and, for the embedded store, create) the store and the experiment.

    Safe from several threads or processes at once: the embedded sqlite schema is created
    under a file lock, aside, and moved into place complete. Runs left RUNNING by a process
    that is gone are ended KILLED (:meth:`CellClaims.end_stale_runs`). Raises
    :class:`~tasks.tracking.TrackingUnavailable` with what to do when the store cannot be used.

    One connection per process and store: connecting again with the same resolved settings
    (and the same ``NLLAB_HOME`` and ``NLLAB_ARTIFACT_ROOT``) returns the objects already
    opened, without locking, creating or opening the store again; only a check that its
    experiment is still active and its two queries for leftovers (:meth:`Tracking.tidy`) run
    again, which also check that the store still answers. An embedded store whose file was
    deleted or replaced since, a deleted experiment, or a store that no longer answers gets a
    fresh, checked connection (re-created, or refused with what to do).
    """
    settings = TrackingSettings.resolve(config)
    point_mlflow_at(settings)
    key = (settings, str(data_home()), os.environ.get("NLLAB_ARTIFACT_ROOT"))
    with _CONNECTED_LOCK:
        opened = _CONNECTED.get(key)
    if opened is not None and opened[1] == store_identity(settings):
        try:
            # deleted since (another process, the UI): a fresh connection says what to do
            if opened[0].store.is_active():
                opened[0].tidy()
                return opened[0]
        except Exception:
            pass  # the store no longer answers: a fresh connection says why
    tracking = Tracking.over(Store.open(settings))
    tracking.tidy()
    with _CONNECTED_LOCK:
        _CONNECTED[key] = (tracking, store_identity(settings))
    return tracking


def attach(settings: TrackingSettings, experiment_id: str) -> Tracking:
    """The process's tracking objects for an experiment that :func:`connect` already opened.

    Used inside task workers (threads or Dask processes): only settings travel to them."""
    key = (settings, experiment_id)
    with _ATTACHED_LOCK:
        if key not in _ATTACHED:
            _ATTACHED[key] = Tracking.over(Store(settings, experiment_id))
        return _ATTACHED[key]
