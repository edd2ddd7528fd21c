"""Scale-out of any flow's cells on Dask, through ``prefect_dask.DaskTaskRunner``.

* No address: a local cluster of ``n_workers`` single-threaded workers with ``processes=False``.
  Worker *processes* on the temporary Prefect server each start their own server on the same
  sqlite file (slow, failing runs; see the platform notes), so the local default uses threads.
* ``--dask-address tcp://HOST:8786``: the given cluster (``dask scheduler`` + ``dask worker``
  on any machines; see ``docs/scale-out.md``). Workers then need the project installed, a
  Prefect server (``PREFECT_API_URL``) and a tracking store they can reach: an MLflow server, not
  the embedded sqlite file of the submitting machine.

Cell tasks carry the resolved tracking settings (``CellRuntime.tracking``), not a live client,
so every worker logs to the tracking store configured where the flow was started.
"""

from __future__ import annotations

import os

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from tasks.config.run_settings import dask_address_problem
from tasks.errors import SettingError, Unreachable
from tasks.tracking import TrackingSettings

__all__ = [
    "DaskSetupError",
    "DaskUnreachable",
    "check_cluster_tracking",
    "check_scheduler",
    "dask_task_runner",
    "is_local_address",
]


class DaskSetupError(SettingError):
    """The Dask setup cannot work as configured; the message says what to change."""


class DaskUnreachable(DaskSetupError, Unreachable):
    """No Dask scheduler answers at the given address (a fault of the environment)."""


#: Seconds to wait for a scheduler's port to accept a connection before giving up.
CONNECT_SECONDS = 5.0


def check_scheduler(address: str, timeout: float = CONNECT_SECONDS) -> None:
    """Raise :class:`DaskUnreachable` unless something accepts connections at ``address``'s
    host and port within ``timeout`` seconds (before any flow starts, instead of Dask's own
    retries with tracebacks). Only ``tcp://`` and ``tls://`` addresses are probed."""
    from flows.runtime.faults import connect_error

    error = connect_error(address, timeout)
    if isinstance(error, ValueError):
        problem = dask_address_problem(address) or f"{address!r}: {error}"
        raise DaskSetupError(f"--dask-address {problem}")
    if error is not None:
        raise DaskUnreachable(
            f"no Dask scheduler answers at {address} ({error.strerror or error}, waited "
            f"{timeout:.0f} s): start it (`dask scheduler --port PORT`) or correct --dask-address"
        )


def is_local_address(address: str) -> bool:
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def check_cluster_tracking(address: str | None, settings: TrackingSettings) -> None:
    """Refuse a remote cluster with the embedded sqlite store: remote workers cannot reach it."""
    if address and settings.is_embedded and not is_local_address(address):
        raise DaskSetupError(
            f"the Dask cluster at {address} runs tasks on other machines, but runs are tracked "
            f"in the local file {settings.tracking_uri!r}, which they cannot reach. Start an "
            "MLflow server (docs/scale-out.md) and set MLFLOW_TRACKING_URI=http://HOST:5000."
        )
    if address and not os.environ.get("PREFECT_API_URL"):
        # Not fatal for in-process work, but remote workers report task states to Prefect.
        import warnings

        warnings.warn(
            f"Dask cluster {address} with no PREFECT_API_URL: workers report task runs to a "
            "temporary Prefect server of their own; start `prefect server start` and set "
            "PREFECT_API_URL on the submitting machine and on every worker",
            stacklevel=2,
        )


def dask_task_runner(
    n_workers: int, address: str | None = None, tracking: TrackingSettings | None = None
):
    """A ``DaskTaskRunner`` on ``address``, or on a local ``n_workers``-thread cluster.

    With ``tracking``, a remote cluster is refused when its workers could not reach the store.
    """
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as e:  # pragma: no cover - prefect-dask is a dependency
        raise DaskSetupError("--task-runner dask needs prefect-dask installed") from e
    if address:
        if (problem := dask_address_problem(address)) is not None:
            raise DaskSetupError(f"--dask-address {problem}")
        if tracking is not None:
            check_cluster_tracking(address, tracking)
        check_scheduler(address)
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": n_workers,
            "processes": False,
            "threads_per_worker": 1,
            "dashboard_address": None,
        }
    )
