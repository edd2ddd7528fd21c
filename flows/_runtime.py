"""Prefect runtime settings shared by every flow: local ephemeral mode, capped task runners."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import tasks._env  # noqa: F401  (offline switches before mlflow/prefect load)

# isort: split
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from tasks.config import RunConfig

__all__ = ["flow_settings", "make_task_runner"]


@contextmanager
def flow_settings() -> Iterator[None]:
    """Settings for a flow call: no heartbeat (it adds ~1 s per flow call on the local server)."""
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def make_task_runner(config: RunConfig) -> TaskRunner:
    """A task runner with at most ``config.max_workers`` cells at once."""
    if config.task_runner == "dask":
        from flows._dask import dask_task_runner
        from tasks.tracking import TrackingSettings

        return dask_task_runner(
            config.max_workers, config.dask_address, TrackingSettings.resolve(config.tracking)
        )
    return ThreadPoolTaskRunner(max_workers=config.max_workers)
