"""What every flow runs on: Prefect's runtime settings and task runners (:mod:`._prefect`, the
Dask runner :mod:`._dask`), the Prefect server a command starts or finds
(:mod:`.prefect_server`), the artifacts a flow publishes and ``nllab artifacts`` reads back
(:mod:`._artifacts`), the environment's faults as one line and exit code 3 (:mod:`.faults`),
and what user code leaves behind when a command ends (:mod:`._leftovers`).

Names load on first use (PEP 562): the command line reads :func:`describe_fault` and the log
helpers before Prefect loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlmodels.lazy import lazy_face

if TYPE_CHECKING:
    from flows.runtime._artifacts import (
        ArtifactsUnreadable,
        StoredArtifact,
        artifact_key,
        publish_markdown,
        publish_table,
        read_artifacts,
    )
    from flows.runtime._dask import dask_task_runner
    from flows.runtime._leftovers import adopt_orphans, end_children, end_with_work
    from flows.runtime._prefect import flow_settings, guarded_servers, make_task_runner
    from flows.runtime.faults import (
        EnvironmentFault,
        check_free_space,
        connect_error,
        describe_fault,
        fault_in_text,
        reserve_log_space,
        write_log,
    )
    from flows.runtime.prefect_server import healthy, require_server

_LAZY = {
    "flow_settings": "_prefect",
    "make_task_runner": "_prefect",
    "guarded_servers": "_prefect",
    "dask_task_runner": "_dask",
    "artifact_key": "_artifacts",
    "publish_table": "_artifacts",
    "publish_markdown": "_artifacts",
    "read_artifacts": "_artifacts",
    "StoredArtifact": "_artifacts",
    "ArtifactsUnreadable": "_artifacts",
    "adopt_orphans": "_leftovers",
    "end_children": "_leftovers",
    "end_with_work": "_leftovers",
    "EnvironmentFault": "faults",
    "check_free_space": "faults",
    "connect_error": "faults",
    "describe_fault": "faults",
    "fault_in_text": "faults",
    "reserve_log_space": "faults",
    "write_log": "faults",
    "healthy": "prefect_server",
    "require_server": "prefect_server",
}

__all__ = [
    "ArtifactsUnreadable",
    "EnvironmentFault",
    "StoredArtifact",
    "adopt_orphans",
    "artifact_key",
    "check_free_space",
    "connect_error",
    "dask_task_runner",
    "describe_fault",
    "end_children",
    "end_with_work",
    "fault_in_text",
    "flow_settings",
    "guarded_servers",
    "healthy",
    "make_task_runner",
    "publish_markdown",
    "publish_table",
    "read_artifacts",
    "require_server",
    "reserve_log_space",
    "write_log",
]


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
