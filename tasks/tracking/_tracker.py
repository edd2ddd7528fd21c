"""The :class:`Tracker`: one connection to one experiment of one tracking store, composed of the
store, runs, claims, queries and registry halves defined beside it."""

from __future__ import annotations

import threading

from mlflow import MlflowClient

from tasks.tracking._claims import _ClaimsMixin
from tasks.tracking._queries import _QueriesMixin
from tasks.tracking._registry import _RegistryMixin
from tasks.tracking._runs import _RunsMixin
from tasks.tracking._store import TrackingSettings, _StoreMixin

__all__ = ["Tracker"]


class Tracker(_StoreMixin, _RunsMixin, _ClaimsMixin, _QueriesMixin, _RegistryMixin):
    """Connection to one experiment of one tracking store.

    Open it with :meth:`connect` (a command; once per process and store) or :meth:`attach` (a
    task worker, given the settings and experiment id the command opened).
    """

    def __init__(self, settings: TrackingSettings) -> None:
        self.settings = settings
        self.client = MlflowClient(tracking_uri=settings.tracking_uri)
        self._experiment_id: str | None = None
        self._claims_run_id: str | None = None
        self._dataset_lock = threading.Lock()
        #: run id -> id of the logged model this process logged for it (:meth:`log_model`)
        self._run_models: dict[str, str] = {}
        #: run id -> (name, digest) of the data set it logged (:meth:`log_dataset`)
        self._run_datasets: dict[str, tuple[str, str]] = {}
