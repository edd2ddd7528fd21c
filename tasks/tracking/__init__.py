"""The one MLflow adapter of the platform: every MLflow call goes through this package.

It uses ``MlflowClient`` with explicit run ids only (no fluent "active run"), so concurrently
running cells in threads can never log into each other's runs. Settings come from the environment,
seeded by ``mlflow.env`` (see :mod:`tasks._env`); the embedded default is a sqlite store and an
artifact folder under ``data_home()/"mlflow"``.

:func:`connect` (a command) or :func:`attach` (a task worker) opens the :class:`Store` and builds
its :class:`Tracking` objects, each with its own handle on the store: the :class:`RunLog` (runs
created, logged into and ended; the run life cycle :meth:`RunLog.run`), the :class:`CellClaims`
(claims, heartbeats, runs of processes gone), the :class:`Queries` (finished cells, runs, the UI
view; answered as the platform's own records, :mod:`~tasks.tracking.records`, never as MLflow
objects) and the :class:`Registry` (champions). Light modules, without MLflow:
:mod:`~tasks.tracking.tags` (tag and metric names), :mod:`~tasks.tracking.locations` (where the
store is), :mod:`~tasks.tracking.processes` (who owns a run or claim), and
:mod:`~tasks.tracking.naming` (run names); :mod:`~tasks.tracking.parent` is a command's parent
run.

Names load on first use (PEP 562): importing a light module of this package never loads MLflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from nlmodels.lazy import lazy_face

if TYPE_CHECKING:
    from tasks.tracking._claims import CLAIM_STALE_AFTER, CellClaims
    from tasks.tracking._connect import Tracking, attach, connect
    from tasks.tracking._queries import UI_VIEW_KEY, Queries
    from tasks.tracking._registry import CHAMPION, Promotion, Registry
    from tasks.tracking._runs import RunLog
    from tasks.tracking._store import (
        Store,
        TrackingSettings,
        TrackingUnavailable,
        git_commit,
        relocate_artifacts,
    )
    from tasks.tracking.locations import embedded_tracking_uri
    from tasks.tracking.naming import cell_variant, run_name
    from tasks.tracking.parent import ParentRun, parent_run
    from tasks.tracking.processes import claim_owner, owner_gone
    from tasks.tracking.records import RunRecord, StoredRun
    from tasks.tracking.tags import Metrics, RunTags

_LAZY = {
    "CLAIM_STALE_AFTER": "_claims",
    "CellClaims": "_claims",
    "Tracking": "_connect",
    "attach": "_connect",
    "connect": "_connect",
    "UI_VIEW_KEY": "_queries",
    "Queries": "_queries",
    "RunRecord": "records",
    "StoredRun": "records",
    "CHAMPION": "_registry",
    "Promotion": "_registry",
    "Registry": "_registry",
    "RunLog": "_runs",
    "Store": "_store",
    "TrackingSettings": "_store",
    "TrackingUnavailable": "_store",
    "git_commit": "_store",
    "relocate_artifacts": "_store",
    "embedded_tracking_uri": "locations",
    "cell_variant": "naming",
    "run_name": "naming",
    "ParentRun": "parent",
    "parent_run": "parent",
    "claim_owner": "processes",
    "owner_gone": "processes",
    "Metrics": "tags",
    "RunTags": "tags",
}

__all__ = [
    "CHAMPION",
    "CLAIM_STALE_AFTER",
    "UI_VIEW_KEY",
    "CellClaims",
    "Metrics",
    "ParentRun",
    "Promotion",
    "Queries",
    "Registry",
    "RunLog",
    "RunRecord",
    "RunTags",
    "Store",
    "StoredRun",
    "Tracking",
    "TrackingSettings",
    "TrackingUnavailable",
    "attach",
    "cell_variant",
    "claim_owner",
    "connect",
    "embedded_tracking_uri",
    "git_commit",
    "owner_gone",
    "parent_run",
    "relocate_artifacts",
    "run_name",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
