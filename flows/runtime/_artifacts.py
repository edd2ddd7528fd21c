"""Prefect artifacts of a flow run: its results as keyed table and Markdown artifacts, and
reading them back (``nllab artifacts``).

Under one key the Prefect UI shows the latest artifact and its history (each night's table of
a scheduled benchmark, say). Outside a Prefect run there is nothing to attach them to, and an
artifact that cannot be written never fails the flow that computed the results: a warning.
Numbers in a table are written as the console tables write them
(:func:`tasks.reports.tables.number`).

Reading asks the Prefect server at ``PREFECT_API_URL`` when one is set; otherwise it reads the
local Prefect database (the temporary servers' sqlite file under ``PREFECT_HOME``) directly,
without starting a server. A run may be writing to it: a busy database is read again after
short waits (:data:`BUSY_WAITS`) and :class:`ArtifactsBusy` says so in one line when it stays
busy.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

__all__ = [
    "BUSY_WAITS",
    "ArtifactsBusy",
    "ArtifactsUnreadable",
    "StoredArtifact",
    "artifact_key",
    "artifacts_from_database",
    "artifacts_from_server",
    "prefect_database",
    "publish_markdown",
    "publish_table",
    "read_artifacts",
]


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) of ``parts``."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(("nllab", *parts)).lower()).strip("-")


def _clean(value: object) -> object:
    """A table value for JSON: a plain int or string; a float as the console tables print it
    (4 significant digits, ``–`` when missing or not finite), not as 17 digits."""
    from tasks.reports import number

    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return number(value) if math.isfinite(value) else "–"
    return value


def _in_a_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def publish_table(key: str, rows: Sequence[Mapping[str, object]], description: str) -> None:
    """``rows`` as the table artifact ``key`` of the current Prefect run."""
    if not _in_a_run():
        return
    try:
        from prefect.artifacts import create_table_artifact

        table = [{k: _clean(v) for k, v in r.items()} for r in rows]
        create_table_artifact(table=table, key=key, description=description)
    except Exception as e:  # the results are in MLflow already
        _warn(key, e)


def publish_markdown(key: str, markdown: str, description: str) -> None:
    """``markdown`` as the Markdown artifact ``key`` of the current Prefect run."""
    if not _in_a_run():
        return
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(markdown=markdown, key=key, description=description)
    except Exception as e:
        _warn(key, e)


def _warn(key: str, error: Exception) -> None:
    from prefect import get_run_logger

    get_run_logger().warning(
        "Prefect artifact %s not written: %s: %s", key, type(error).__name__, error
    )


# -- reading them back ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredArtifact:
    """A Prefect artifact as read back: a table's ``data`` is its rows, Markdown's its text."""

    key: str
    type: str
    created: str  # "YYYY-MM-DD HH:MM:SS" (UTC)
    description: str
    data: object


class ArtifactsUnreadable(RuntimeError):
    """The artifacts cannot be read (no server answers, the database is not sqlite): one line."""


class ArtifactsBusy(ArtifactsUnreadable):
    """The Prefect database stayed locked by a writer through every retry."""


#: Seconds to wait before each new read of a busy database (a writer holds it for moments).
BUSY_WAITS = (0.2, 0.5, 1.0, 2.0)


def _decoded(data: object) -> object:
    """An artifact's data as Prefect stores it (a table: JSON text of its rows, maybe inside a
    JSON string) as plain values."""
    for _ in range(2):
        if not isinstance(data, str):
            break
        try:
            data = json.loads(data)
        except ValueError:
            break
    return data


def prefect_database() -> Path | None:
    """The local Prefect database (``PREFECT_API_DATABASE_CONNECTION_URL``, by default
    ``PREFECT_HOME/prefect.db``), or ``None`` when it is not a sqlite file."""
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    url = PREFECT_API_DATABASE_CONNECTION_URL.value() or ""
    scheme, _, rest = url.partition(":///")
    return Path(rest) if scheme.startswith("sqlite") and rest else None


def artifacts_from_database(path: Path, prefix: str) -> list[StoredArtifact]:
    """The artifacts whose key starts with ``prefix`` in the Prefect sqlite database ``path``,
    newest first (read only; retried while busy, then :class:`ArtifactsBusy`)."""
    query = (
        "SELECT key, type, created, description, data FROM artifact "
        "WHERE key LIKE ? ORDER BY created DESC"
    )
    for wait in (*BUSY_WAITS, None):
        try:
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.1)) as db:
                rows = db.execute(query, (prefix.replace("%", "") + "%",)).fetchall()
            break
        except sqlite3.Error as e:
            if "locked" not in str(e) and "busy" not in str(e):
                raise ArtifactsUnreadable(
                    f"the Prefect database {path} cannot be read ({e})"
                ) from None
            if wait is None:
                raise ArtifactsBusy(
                    f"the Prefect database {path} is busy (a run is writing to it) and stayed "
                    f"so for {sum(BUSY_WAITS):.1f} s; try again in a moment"
                ) from None
            time.sleep(wait)
    return [
        StoredArtifact(key, kind or "", str(created)[:19], description or "", _decoded(data))
        for key, kind, created, description, data in rows
    ]


def artifacts_from_server(api: str, prefix: str) -> list[StoredArtifact]:
    """The artifacts whose key starts with ``prefix`` on the Prefect server at ``api``, newest
    first (retried while it does not answer, then :class:`ArtifactsUnreadable`)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    wanted = ArtifactFilter(key=ArtifactFilterKey(like_=prefix + "%"))
    for wait in (*BUSY_WAITS, None):
        try:
            with get_client(sync_client=True) as client:
                found = client.read_artifacts(
                    artifact_filter=wanted, sort=ArtifactSort.CREATED_DESC
                )
            break
        except Exception as e:
            if wait is None:
                raise ArtifactsUnreadable(
                    f"the Prefect server at {api} did not answer ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''})"
                ) from None
            time.sleep(wait)
    return [
        StoredArtifact(
            a.key or "",
            a.type or "",
            a.created.strftime("%Y-%m-%d %H:%M:%S") if a.created else "",
            a.description or "",
            _decoded(a.data),
        )
        for a in found
    ]


#: The settings that move where artifacts are read: a server, or another database.
_WHERE_SETTINGS = (
    "PREFECT_API_URL",
    "PREFECT_API_DATABASE_CONNECTION_URL",
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
)


def _default_database() -> Path | None:
    """``PREFECT_HOME/prefect.db`` when nothing can point Prefect elsewhere, found without
    importing Prefect (its settings take seconds to load): Prefect not loaded yet (settings
    changed in this process), none of :data:`_WHERE_SETTINGS` in the environment or the active
    profile, and no settings file in the working directory. ``None``: ask Prefect."""
    if "prefect" in sys.modules or any(os.environ.get(k) for k in _WHERE_SETTINGS):
        return None
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    profiles = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml")
    try:
        found = tomllib.loads(profiles.read_text()) if profiles.is_file() else {}
    except (OSError, ValueError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or found.get("active") or "ephemeral"
    profile = (found.get("profiles") or {}).get(active) or {}
    if not isinstance(profile, dict) or any(k in profile for k in _WHERE_SETTINGS):
        return None
    here = Path.cwd()
    if (here / "prefect.toml").exists() or "PREFECT_" in _text(here / ".env"):
        return None
    if "[tool.prefect" in _text(here / "pyproject.toml"):
        return None
    return home / "prefect.db"


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace") if path.is_file() else ""
    except OSError:
        return ""


def read_artifacts(prefix: str = "nllab-") -> tuple[list[StoredArtifact], str]:
    """The artifacts whose key starts with ``prefix``, newest first, and where they were read
    (the server at ``PREFECT_API_URL``, else the local database; none there yet: empty)."""
    path = _default_database()
    if path is None:
        from prefect.settings import PREFECT_API_URL

        if api := PREFECT_API_URL.value():
            return artifacts_from_server(api, prefix), f"the Prefect server at {api}"
        path = prefect_database()
    if path is None:
        raise ArtifactsUnreadable(
            "the Prefect database is not a sqlite file: set PREFECT_API_URL to its server"
        )
    if not path.is_file():
        return [], str(path)
    return artifacts_from_database(path, prefix), str(path)
