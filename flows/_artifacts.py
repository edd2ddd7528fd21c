"""Prefect artifacts of a flow run: its results as keyed table and Markdown artifacts.

Under one key the Prefect UI shows the latest artifact and its history (each night's table of
a scheduled benchmark, say). Outside a Prefect run there is nothing to attach them to, and an
artifact that cannot be written never fails the flow that computed the results: a warning.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

__all__ = ["artifact_key", "publish_markdown", "publish_table"]


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) of ``parts``."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(("nllab", *parts)).lower()).strip("-")


def _clean(value: object) -> object:
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()  # a plain int or float for JSON
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN
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
