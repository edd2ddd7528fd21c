"""The one MLflow adapter of the platform: every MLflow call goes through this package.

It uses ``MlflowClient`` with explicit run ids only (no fluent "active run"), so concurrently
running cells in threads can never log into each other's runs. Settings come from the environment,
seeded by ``mlflow.env`` (see :mod:`tasks._env`); the embedded default is a sqlite store and an
artifact folder under ``data_home()/"mlflow"``.

Its modules: :mod:`~tasks.tracking.tags` (run-tag names), :mod:`~tasks.tracking.naming` (run
names), :mod:`~tasks.tracking.parent` (a command's parent run), and the halves of the
:class:`Tracker`: ``_store`` (settings, creating, locking and opening the store), ``_runs``
(logging), ``_claims`` (cell claims and heartbeats), ``_queries`` (finished cells, runs, the
UI view) and ``_registry`` (champions).
"""

from __future__ import annotations

from tasks.tracking._claims import CLAIM_STALE_AFTER, claim_owner, owner_gone
from tasks.tracking._queries import UI_VIEW_KEY, RunRecord
from tasks.tracking._registry import CHAMPION, Promotion
from tasks.tracking._store import (
    TrackingSettings,
    TrackingUnavailable,
    embedded_tracking_uri,
    git_commit,
    relocate_artifacts,
)
from tasks.tracking._tracker import Tracker
from tasks.tracking.naming import cell_variant, run_name
from tasks.tracking.parent import ParentRun, parent_run
from tasks.tracking.tags import RunTags

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
    "owner_gone",
    "parent_run",
    "relocate_artifacts",
    "run_name",
]
