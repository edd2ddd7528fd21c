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
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as e:  # pragma: no cover - prefect-dask is a dependency
            raise RuntimeError("--task-runner dask needs prefect-dask installed") from e
        if config.dask_address:
            return DaskTaskRunner(address=config.dask_address)
        # Threads, not processes: worker processes would each start their own Prefect server.
        return DaskTaskRunner(
            cluster_kwargs={
                "n_workers": config.max_workers,
                "processes": False,
                "threads_per_worker": 1,
                "dashboard_address": None,
            }
        )
    return ThreadPoolTaskRunner(max_workers=config.max_workers)
