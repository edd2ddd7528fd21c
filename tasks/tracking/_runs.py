"""Runs of the MLflow adapter: creating them, logging into them and ending them.

Every call names its run explicitly (``MlflowClient`` with run ids, never MLflow's fluent
"active run"), so cells running in threads can never log into each other's runs. Each run
records its host and process (:attr:`RunTags.HOST`, :attr:`RunTags.PROCESS`), so a later start
ends the runs whose process is gone (:meth:`~tasks.tracking.CellClaims.end_stale_runs`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from mlflow.entities import Dataset as MlflowDataset
from mlflow.entities import DatasetInput, InputTag, Metric, Param
from mlflow.exceptions import MlflowException

from tasks.errors import Interrupted
from tasks.tracking._logged_model import log_pyfunc_model
from tasks.tracking._store import Store, git_commit
from tasks.tracking.processes import host_id, process_token
from tasks.tracking.tags import MAX_PARAM, MAX_TAG, METRIC_BATCH, PARAM_BATCH, RunTags

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]

#: What a run's end may add to its tags, given the error it ended with (``None``: completed).
OutcomeTags = Callable[[BaseException | None], Mapping[str, object]]


class RunLog:
    """Runs: create them, log params, metrics, artifacts, models and data sets into them, end
    them; the run life cycle (:meth:`run`) is written here once."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._client = store.client
        self._dataset_lock = threading.Lock()
        #: run id -> id of the logged model this process logged for it (:meth:`log_model`)
        self._run_models: dict[str, str] = {}
        #: run id -> (name, digest) of the data set it logged (:meth:`log_dataset`)
        self._run_datasets: dict[str, tuple[str, str]] = {}
        #: runs opened by :meth:`run` that no call has ended yet
        self._open: set[str] = set()

    def create_run(
        self, name: str, tags: Mapping[str, str], parent_run_id: str | None = None
    ) -> str:
        all_tags = {
            **{k: str(v) for k, v in tags.items()},
            RunTags.GIT_COMMIT: git_commit(),
        }
        if parent_run_id is not None:
            all_tags[RunTags.PARENT] = parent_run_id
        all_tags[RunTags.HOST] = host_id()
        all_tags[RunTags.PROCESS] = process_token(os.getpid()) or str(os.getpid())
        run = self._client.create_run(self._store.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def end_run(self, run_id: str, status: RunStatus) -> None:
        self._open.discard(run_id)
        self._store.end_run(run_id, status)

    @contextmanager
    def run(
        self,
        name: str,
        tags: Mapping[str, str],
        parent_run_id: str | None = None,
        *,
        resume: str | None = None,
        killed_by: tuple[type[BaseException], ...] = (),
        outcome_tags: OutcomeTags | None = None,
    ) -> Iterator[str]:
        """The run life cycle: a run (created, or the recorded run ``resume`` continued) that
        ends FINISHED only if the block completes.

        An exception ends it FAILED with the error as tag ``error``; Ctrl-C, an
        :class:`~tasks.errors.Interrupted` error or one of ``killed_by`` ends it KILLED. The
        exception propagates. ``outcome_tags(error or None)`` adds tags as it ends. A run the
        block ended itself (:meth:`end_run`, :meth:`end_with_error`) is left as it was ended.
        """
        run_id = self.create_run(name, tags, parent_run_id) if resume is None else resume
        self._open.add(run_id)
        try:
            yield run_id
        except BaseException as e:
            if run_id in self._open:
                extra = outcome_tags(e) if outcome_tags is not None else {}
                self.end_with_error(run_id, e, killed=isinstance(e, killed_by), tags=extra)
            raise
        if run_id in self._open:
            if outcome_tags is not None:
                self.set_tags(run_id, outcome_tags(None))
            self.end_run(run_id, "FINISHED")

    def reopen(self, run_id: str) -> bool:
        """Make a recorded run of this experiment RUNNING again, without the error an earlier
        session ended it with (a study's parent run, continued); ``False`` when the run
        belongs to another experiment."""
        run = self._client.get_run(run_id)
        if run.info.experiment_id != self._store.experiment_id:
            return False
        if RunTags.ERROR in run.data.tags:
            self._client.delete_tag(run_id, RunTags.ERROR)
        if run.info.status != "RUNNING":
            self._client.update_run(run_id, status="RUNNING")
        return True

    def end_with_error(
        self,
        run_id: str,
        error: BaseException,
        *,
        killed: bool = False,
        tags: Mapping[str, object] | None = None,
    ) -> None:
        """End ``run_id`` because of ``error`` (its tag ``error``, with ``tags``): KILLED for
        Ctrl-C, an :class:`~tasks.errors.Interrupted` error or ``killed``, FAILED for anything
        else."""
        killed = killed or isinstance(error, KeyboardInterrupt | Interrupted)
        message = f"{type(error).__name__}: {error}"[:MAX_TAG]
        try:
            self.set_tags(run_id, {**(tags or {}), RunTags.ERROR: message})
        finally:
            self.end_run(run_id, "KILLED" if killed else "FAILED")

    def set_tags(self, run_id: str, tags: Mapping[str, object]) -> None:
        self._store.set_tags(run_id, tags)

    def log_params(self, run_id: str, params: Mapping[str, object]) -> None:
        items = [Param(k, str(v)[:MAX_PARAM]) for k, v in params.items()]
        for i in range(0, len(items), PARAM_BATCH):
            self._client.log_batch(run_id, params=items[i : i + PARAM_BATCH])

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: int | None = None
    ) -> None:
        ts = int(time.time() * 1000)
        # Metrics logged after the run's model are linked to it and to the run's data set (the
        # UI's Models tab shows both beside the model).
        model_id = self._run_models.get(run_id)
        name, digest = self._run_datasets.get(run_id, (None, None)) if model_id else (None, None)
        items = [
            Metric(k, float(v), ts, step or 0, model_id, dataset_name=name, dataset_digest=digest)
            for k, v in metrics.items()
        ]
        for i in range(0, len(items), METRIC_BATCH):
            self._client.log_batch(run_id, metrics=items[i : i + METRIC_BATCH])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        p = Path(path)
        if p.is_dir():
            self._client.log_artifacts(run_id, str(p), artifact_path)
        else:
            self._client.log_artifact(run_id, str(p), artifact_path)

    def log_model(self, run_id: str, folder: str | Path, artifact_path: str = "model") -> str:
        """Log a saved model (the folder of :func:`tasks.modelio.save_model`) as an MLflow 3
        *logged model* of the run (:func:`~tasks.tracking._logged_model.log_pyfunc_model`).

        Metrics the run logs afterwards (``test_rmse``) are linked to it (:meth:`log_metrics`),
        so the experiment's Models tab lists it with its score. Returns the logged model's id
        (``models:/<id>`` loads it), which ``runs:/<run id>/<artifact_path>`` also reaches."""
        model_id = log_pyfunc_model(self._store, run_id, Path(folder), artifact_path)
        self._run_models[run_id] = model_id
        return model_id

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._client.log_text(run_id, text, artifact_file)

    def log_dataset(
        self,
        run_id: str,
        *,
        name: str,
        digest: str,
        source: str,
        profile: Mapping[str, object],
        context: str = "training",
    ) -> None:
        """Record a data set as an MLflow dataset input of the run."""
        ds = MlflowDataset(
            name=name,
            digest=digest[:36],
            source_type="local",
            source=json.dumps({"uri": source}),
            profile=json.dumps(dict(profile)),
        )
        inputs = [DatasetInput(ds, tags=[InputTag("mlflow.data.context", context)])]
        # The first run to log a data set creates its row; a writer racing it (another cell,
        # another process) hits the unique constraint once and then just links the row.
        with self._dataset_lock:
            try:
                self._client.log_inputs(run_id, datasets=inputs)
            except MlflowException:
                time.sleep(0.2)
                self._client.log_inputs(run_id, datasets=inputs)
        self._run_datasets[run_id] = (ds.name, ds.digest)

    def end_runs_of_process(self, pid: int, error: str, status: RunStatus = "FAILED") -> list[str]:
        """End ``status`` (tag ``error``) every RUNNING run that process ``pid`` of this host
        created, e.g. a worker process that died mid-cell; their ids."""
        host, ended = host_id(), []
        for r in list(self._store.search("attributes.status = 'RUNNING'")):
            tags = r.data.tags
            run_pid = tags.get(RunTags.PROCESS, "").split(":")[0]
            if tags.get(RunTags.HOST) == host and run_pid == str(pid):
                self.set_tags(r.info.run_id, {RunTags.ERROR: error[:MAX_TAG]})
                self.end_run(r.info.run_id, status)
                ended.append(r.info.run_id)
        return ended
