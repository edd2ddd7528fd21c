"""The parent run of a command (benchmark, study, reproduce, tune): one context for all."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tasks.tracking._runs import RunLog
from tasks.tracking.tags import MAX_TAG, RunTags

__all__ = ["ParentRun", "parent_run"]


@dataclass(frozen=True)
class ParentRun:
    """An open parent run of a command: the run id and the run log that logs into it."""

    runs: RunLog
    run_id: str

    def record_cells(self, results: Iterable[Any], *, note: str | None = None) -> None:
        """Tag how the command's cells ended (``cells``, ``cells_finished|reused|failed``)
        and, with ``note``, the run's description shown on its MLflow page."""
        results = list(results)
        statuses = [r.status for r in results]
        tags: dict[str, object] = {
            RunTags.CELLS: len(results),
            RunTags.CELLS_FINISHED: statuses.count("finished"),
            RunTags.CELLS_REUSED: statuses.count("reused"),
            RunTags.CELLS_FAILED: sum(not r.ok for r in results),
        }
        if note is not None:
            tags[RunTags.NOTE] = note[:MAX_TAG]
        self.runs.set_tags(self.run_id, tags)


@contextmanager
def parent_run(
    runs: RunLog,
    name: str,
    *,
    kind: str,
    params: Mapping[str, object] | None = None,
    tags: Mapping[str, object] | None = None,
    execution: Mapping[str, object] | None = None,
    config_json: tuple[str, str] | None = None,
    source_run_id: str | None = None,
    resume: str | None = None,
) -> Iterator[ParentRun]:
    """The parent run of one command (benchmark, study, reproduce, tune), every command alike.

    It is tagged with its ``kind`` and ``tags``, logs ``params``, the execution settings as
    ``execution.*`` tags (how it ran, not what: they are not part of any config hash) and
    ``config_json`` (text, artifact file name). ``source_run_id`` nests it under another run;
    ``resume`` continues a recorded run (reopened with :meth:`RunLog.reopen`) instead of creating
    one. It ends as :meth:`RunLog.run` ends a run.
    """
    all_tags = {RunTags.KIND: kind, **{k: str(v) for k, v in (tags or {}).items()}}
    with runs.run(name, all_tags, source_run_id, resume=resume) as run_id:
        if resume is not None:
            runs.set_tags(run_id, {**all_tags, RunTags.RESUMED: "true"})
        if params:
            runs.log_params(run_id, params)
        if execution:
            runs.set_tags(
                run_id, {f"{RunTags.EXECUTION_PREFIX}{k}": v for k, v in execution.items()}
            )
        if config_json is not None:
            runs.log_text(run_id, config_json[0], config_json[1])
        yield ParentRun(runs, run_id)
