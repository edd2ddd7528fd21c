"""Runs of the MLflow adapter: creating and ending them, logging into them, reading them back.

Every call names its run explicitly (``MlflowClient`` with run ids, never MLflow's fluent
"active run"), so cells running in threads can never log into each other's runs. Each run
records its host and process (:attr:`RunTags.HOST`, :attr:`RunTags.PROCESS`), so a later start
ends the runs whose process is gone (:meth:`_RunsMixin.end_stale_runs`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import mlflow
from mlflow import MlflowClient
from mlflow.entities import (
    Dataset as MlflowDataset,
)
from mlflow.entities import (
    DatasetInput,
    InputTag,
    Metric,
    Param,
    RunTag,
)
from mlflow.exceptions import MlflowException

from tasks.tracking._claims import (
    CLAIM_STALE_AFTER,
    _abandoned_cell_run,
    _host_id,
    _process_alive,
    _process_token,
)
from tasks.tracking._store import TrackingSettings, git_commit
from tasks.tracking.tags import _MAX_PARAM, _MAX_TAG, _METRIC_BATCH, _PARAM_BATCH, RunTags

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]


# MLflow cannot turn the pyfunc's dict-of-arrays ``predict`` hint into a signature (it takes
# list[...] hints only) and says so as it logs a model; the signature is given explicitly. A
# process-wide filter as well as the recording below: ``warnings.catch_warnings`` swaps the
# process's filters, so two cells logging models from two threads at once could restore each
# other's and let the report through (seen on a busy machine).
warnings.filterwarnings(
    "ignore", message="Failed to infer signature from type hint", category=UserWarning
)


class _RunsMixin:
    """Runs: create, end, log params, metrics, artifacts, models and data sets, download."""

    settings: TrackingSettings
    client: MlflowClient
    _dataset_lock: threading.Lock
    #: run id -> id of the logged model this process logged for it (:meth:`log_model`)
    _run_models: dict[str, str]
    _run_datasets: dict[str, tuple[str, str]]

    if TYPE_CHECKING:

        @property
        def experiment_id(self) -> str: ...
        def _search(self, filter_string: str, order_by: list[str] | None = None) -> Iterator: ...
        def _claims_data(self): ...

    def create_run(
        self, name: str, tags: Mapping[str, str], parent_run_id: str | None = None
    ) -> str:
        all_tags = {
            **{k: str(v) for k, v in tags.items()},
            RunTags.GIT_COMMIT: git_commit(),
        }
        if parent_run_id is not None:
            all_tags[RunTags.PARENT] = parent_run_id
        all_tags[RunTags.HOST] = _host_id()
        all_tags[RunTags.PROCESS] = _process_token(os.getpid()) or str(os.getpid())
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def end_run(self, run_id: str, status: RunStatus) -> None:
        self.client.set_terminated(run_id, status=status)

    @contextmanager
    def run(
        self, name: str, tags: Mapping[str, str], parent_run_id: str | None = None
    ) -> Iterator[str]:
        """A run that ends FINISHED only if the block completes.

        An exception ends it FAILED with the error as tag ``error``; Ctrl-C or an interruption
        (exceptions named ``*Interrupted``) ends it KILLED. The exception propagates.
        """
        run_id = self.create_run(name, tags, parent_run_id)
        try:
            yield run_id
        except BaseException as e:
            self.end_with_error(run_id, e)
            raise
        self.end_run(run_id, "FINISHED")

    def end_with_error(self, run_id: str, error: BaseException) -> None:
        """End ``run_id`` because of ``error`` (its tag ``error``): KILLED for Ctrl-C or an
        interruption (exceptions named ``*Interrupted``), FAILED for anything else."""
        interrupted = isinstance(error, KeyboardInterrupt) or type(error).__name__.endswith(
            "Interrupted"
        )
        try:
            self.set_tags(run_id, {RunTags.ERROR: f"{type(error).__name__}: {error}"[:_MAX_TAG]})
        finally:
            self.end_run(run_id, "KILLED" if interrupted else "FAILED")

    def set_tags(self, run_id: str, tags: Mapping[str, object]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_params(self, run_id: str, params: Mapping[str, object]) -> None:
        items = [Param(k, str(v)[:_MAX_PARAM]) for k, v in params.items()]
        for i in range(0, len(items), _PARAM_BATCH):
            self.client.log_batch(run_id, params=items[i : i + _PARAM_BATCH])

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
        for i in range(0, len(items), _METRIC_BATCH):
            self.client.log_batch(run_id, metrics=items[i : i + _METRIC_BATCH])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        p = Path(path)
        if p.is_dir():
            self.client.log_artifacts(run_id, str(p), artifact_path)
        else:
            self.client.log_artifact(run_id, str(p), artifact_path)

    def log_model(self, run_id: str, folder: str | Path, artifact_path: str = "model") -> str:
        """Log a saved model (the folder of :func:`tasks.modelio.save_model`) as an MLflow 3
        *logged model* of the run, with the ``pyfunc`` flavour's own
        logging: an ``MLmodel`` with a tensor signature and an input example, the model code of
        :mod:`tasks.pyfunc_model` (no pickle) and the weights as its ``weights`` artifact.
        ``predict({"obs_t", "obs_x", "query_t"})`` returns the extrapolation.

        The model carries the run's params, and metrics the run logs afterwards (``test_rmse``)
        are linked to it (:meth:`log_metrics`), so the experiment's Models tab lists it with its
        score, named after the cell (``neural_laplace-integro_de-s0``; ``artifact_path`` for a
        run without those tags). Returns the logged model's id (``models:/<id>`` loads it), which
        ``runs:/<run id>/<artifact_path>`` also reaches."""
        from importlib.metadata import PackageNotFoundError, version

        import numpy as np
        from mlflow.entities import LoggedModelStatus
        from mlflow.models import Model, ModelSignature
        from mlflow.types.schema import Schema, TensorSpec

        folder = Path(folder)
        spec = json.loads((folder / "model.json").read_text())
        dim = int(spec["state_dim"])
        f64 = np.dtype("float64")
        signature = ModelSignature(
            inputs=Schema(
                [
                    TensorSpec(f64, (-1, -1), "obs_t"),
                    TensorSpec(f64, (-1, -1, dim), "obs_x"),
                    TensorSpec(f64, (-1, -1), "query_t"),
                ]
            ),
            outputs=Schema([TensorSpec(f64, (-1, -1, dim))]),
        )
        # One trajectory of 8 observed points (the training set's mean state) and 4 queries
        # after them: small, in physical units, and checked by MLflow against the model.
        mean = np.asarray(spec.get("normaliser", {}).get("mean", [0.0] * dim), dtype=f64)
        example = {
            "obs_t": np.linspace(0.0, 1.0, 8)[None],
            "obs_x": np.broadcast_to(mean.reshape(1, 1, -1), (1, 8, dim)).copy(),
            "query_t": np.linspace(1.25, 2.0, 4)[None],
        }
        requirements = []
        for package in ("torch", "numpy", "neural-laplace-lab"):
            try:
                requirements.append(f"{package}=={version(package)}")
            except PackageNotFoundError:
                requirements.append(package)
        run = self.client.get_run(run_id)
        cell = [run.data.tags.get(k) for k in (RunTags.METHOD, RunTags.SYSTEM, RunTags.SEED)]
        name = f"{cell[0]}-{cell[1]}-s{cell[2]}" if all(cell) else artifact_path
        logged = self.client.create_logged_model(
            self.experiment_id,
            name=name.replace(".", "_"),  # MLflow refuses / : . % and quotes in a model's name
            source_run_id=run_id,
            params=dict(run.data.params),
            tags={
                k: run.data.tags[k]
                for k in (RunTags.SYSTEM, RunTags.METHOD, RunTags.SEED)
                if k in run.data.tags
            },
            model_type=str(spec.get("method", "")) or None,
        )
        code = Path(__file__).resolve().parent.parent / "pyfunc_model.py"
        with tempfile.TemporaryDirectory(prefix="nllab-pyfunc-") as tmp:
            # MLflow keeps an artifact folder's own name: copy it as "weights".
            weights = shutil.copytree(folder, Path(tmp) / "weights")
            # The pyfunc flavour's own logging (what mlflow.pyfunc.log_model runs), with the
            # run named explicitly: cells log from worker threads, which have no active run.
            # It links the model to the run and sets the MLmodel's run_id.
            mlflow.set_tracking_uri(self.settings.tracking_uri)
            # MLflow reports, past any filter, that it cannot turn the dict-of-arrays hint into
            # a signature (it takes list[...] hints only): the signature is given, so that
            # report is dropped and any other warning shown as usual.
            with warnings.catch_warnings(record=True) as caught:
                Model.log(
                    None,  # artifact_path: MLflow 3 names a model by ``name``
                    name=logged.name,
                    flavor=mlflow.pyfunc,
                    run_id=run_id,
                    model_id=logged.model_id,
                    python_model=str(code),
                    artifacts={"weights": str(weights)},
                    signature=signature,
                    input_example=example,
                    pip_requirements=requirements,
                )
        for w in caught:
            if not str(w.message).startswith("Failed to infer signature from type hint"):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        self.client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        self._run_models[run_id] = logged.model_id
        return logged.model_id

    def logged_model_id(self, run_id: str) -> str | None:
        """The id of the run's logged model (the newest; a cell logs one), or ``None`` (a run
        from before models were logged as MLflow 3 logged models keeps its model as artifacts)."""
        if run_id in self._run_models:
            return self._run_models[run_id]
        found = self.client.search_logged_models(
            [self.experiment_id],
            filter_string=f"source_run_id = '{run_id}'",
            order_by=[{"field_name": "creation_timestamp", "ascending": False}],
            max_results=1,
        )
        return found[0].model_id if found else None

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

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
                self.client.log_inputs(run_id, datasets=inputs)
            except MlflowException:
                time.sleep(0.2)
                self.client.log_inputs(run_id, datasets=inputs)
        self._run_datasets[run_id] = (ds.name, ds.digest)

    def get_run_data(self, run_id: str):
        """Status, tags, params and latest metrics of a run (``mlflow.entities.Run``)."""
        return self.client.get_run(run_id)

    def download(self, run_id: str, path: str, dst: str | Path) -> Path:
        """Download a run artifact; ``"model"`` is the run's logged model (or, for a run from
        before models were logged so, its ``model`` artifact folder)."""
        model_id = self.logged_model_id(run_id) if path.strip("/") == "model" else None
        if model_id is None:
            return Path(self.client.download_artifacts(run_id, path, str(dst)))
        return Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{model_id}",
                dst_path=str(dst),
                tracking_uri=self.settings.tracking_uri,
            )
        )

    def end_stale_runs(self, *, stale_after: float = CLAIM_STALE_AFTER) -> list[str]:
        """End KILLED every RUNNING run of the experiment that can never finish; their ids.

        Each run records its host and process when created (tags ``nllab.host`` and
        ``nllab.process``: pid and start time, so a recycled pid does not count as alive). A run
        started on this host by a process that no longer exists can never finish (``kill -9``,
        a power cut). Processes of other hosts cannot be asked, so a cell run of another host
        counts as abandoned through its cell's claim: its process stopped heart-beating for
        ``stale_after`` seconds, or another process took the claim over after the run started
        (a Dask worker killed mid-cell, its cell trained again elsewhere). Runs of live
        processes, and runs of other hosts that hold no claim (parents, tuning trials), are
        left alone.
        """
        host = _host_id()
        claims = None
        ended = []
        for r in list(self._search("attributes.status = 'RUNNING'")):
            tags = r.data.tags
            token = tags.get(RunTags.PROCESS)
            if not token:
                continue
            if tags.get(RunTags.HOST) == host:
                if _process_alive(token):
                    continue
            else:
                claims = claims if claims is not None else self._claims_data()
                if not _abandoned_cell_run(r, claims, stale_after):
                    continue
            self.set_tags(
                r.info.run_id, {RunTags.ERROR: f"process {token} ended without closing this run"}
            )
            self.end_run(r.info.run_id, "KILLED")
            ended.append(r.info.run_id)
        return ended

    def end_runs_of_process(self, pid: int, error: str, status: RunStatus = "FAILED") -> list[str]:
        """End ``status`` (tag ``error``) every RUNNING run that process ``pid`` of this host
        created, e.g. a worker process that died mid-cell; their ids."""
        host, ended = _host_id(), []
        for r in list(self._search("attributes.status = 'RUNNING'")):
            tags = r.data.tags
            run_pid = tags.get(RunTags.PROCESS, "").split(":")[0]
            if tags.get(RunTags.HOST) == host and run_pid == str(pid):
                self.set_tags(r.info.run_id, {RunTags.ERROR: error[:_MAX_TAG]})
                self.end_run(r.info.run_id, status)
                ended.append(r.info.run_id)
        return ended
