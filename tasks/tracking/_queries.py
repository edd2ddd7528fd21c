"""Queries of the MLflow adapter: which cells are finished and reusable, which runs a command
left, and how the MLflow UI shows them. Runs are answered as the platform's own records
(:mod:`tasks.tracking.records`), never as MLflow objects."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import mlflow

from tasks.tracking._store import Store
from tasks.tracking.records import RunRecord, StoredRun
from tasks.tracking.tags import ExperimentTags, Metrics, RunTags

__all__ = ["UI_VIEW_KEY", "Queries"]
#: The key of the results view of the runs page (``?viewStateShareKey=``).
UI_VIEW_KEY = "nllab-results"


def _stored_run(run) -> StoredRun:
    """An ``mlflow.entities.Run`` as a :class:`StoredRun`."""
    info, data = run.info, run.data
    return StoredRun(
        info.run_id,
        info.status,
        int(info.start_time or 0),
        dict(data.tags),
        dict(data.metrics),
        dict(data.params),
        info.artifact_uri,
        info.lifecycle_stage == "deleted",
    )


def _cell_record(run) -> RunRecord:
    """A finished cell's ``mlflow.entities.Run`` as a :class:`RunRecord`."""
    tags, metrics = dict(run.data.tags), dict(run.data.metrics)
    return RunRecord(
        run.info.run_id,
        tags.get(RunTags.CONFIG_HASH, ""),
        metrics.get(Metrics.TEST_RMSE),
        tags,
        metrics,
        run.info.artifact_uri,
        int(run.info.start_time or 0),
    )


def _local_path(uri: str | None) -> Path | None:
    """The folder of a local artifact URI (a plain path or ``file://``), else ``None``."""
    if not uri:
        return None
    if uri.startswith("file://"):
        from mlflow.utils.file_utils import local_file_uri_to_path

        return Path(local_file_uri_to_path(uri))
    return None if ":" in uri.split("/", 1)[0] else Path(uri)


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0] if text else ""


def _finished_of_kind(kind: str) -> str:
    """The filter of the FINISHED runs of ``kind`` (a failed or interrupted one has no results)."""
    return f"tags.`{RunTags.KIND}` = '{kind}' and attributes.status = 'FINISHED'"


def _results_charts() -> dict[str, list[dict[str, object]]]:
    """The chart view's first section (the run page's *Chart* tab, MLflow's ``compareRunCharts``
    and ``compareRunSections`` of a shared view): test RMSE by system and method, as parallel
    coordinates over the ``system`` and ``method`` params and as one bar per run. Without it the
    UI draws its own pick: the first params in alphabetical order (``model.*``) against the
    first metric logged (an outlier count of the data)."""
    section = "nllab-results-section"
    card = {"metricSectionId": section, "deleted": False, "isGenerated": False}
    charts: list[dict[str, object]] = [
        {
            **card,
            "uuid": "nllab-rmse-by-system-and-method",
            "type": "PARALLEL",
            "displayName": "test RMSE by system and method",
            "runsCountToCompare": 100,
            "selectedParams": ["system", "method"],  # every cell's params (its config's fields)
            "selectedMetrics": [Metrics.TEST_RMSE],
            "showAllRuns": True,
        },
        {
            **card,
            "uuid": "nllab-rmse-per-run",
            "type": "BAR",
            "displayName": Metrics.TEST_RMSE,
            "runsCountToCompare": 100,
            "metricKey": Metrics.TEST_RMSE,
        },
    ]
    sections: list[dict[str, object]] = [
        {
            "uuid": section,
            "name": "test RMSE by system and method",
            "display": True,
            "isReordered": False,
            "deleted": False,
            "isGenerated": False,
        }
    ]
    return {"compareRunCharts": charts, "compareRunSections": sections}


class Queries:
    """Reading the experiment: finished cells, runs, their models and artifacts, the UI view."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._client = store.client

    @property
    def settings(self):
        """The store's :class:`~tasks.tracking.TrackingSettings` (where a report says it read)."""
        return self._store.settings

    def get_run_data(self, run_id: str) -> StoredRun:
        """Status, tags, params and latest metrics of a run."""
        return _stored_run(self._client.get_run(run_id))

    def logged_model_id(self, run_id: str) -> str | None:
        """The id of the run's logged model (the newest; a cell logs one), or ``None`` (a run
        from before models were logged as MLflow 3 logged models keeps its model as artifacts)."""
        found = self._client.search_logged_models(
            [self._store.experiment_id],
            filter_string=f"source_run_id = '{run_id}'",
            order_by=[{"field_name": "creation_timestamp", "ascending": False}],
            max_results=1,
        )
        return found[0].model_id if found else None

    def download(self, run_id: str, path: str, dst: str | Path) -> Path:
        """Download a run artifact; ``"model"`` is the run's logged model (or, for a run from
        before models were logged so, its ``model`` artifact folder)."""
        model_id = self.logged_model_id(run_id) if path.strip("/") == "model" else None
        if model_id is None:
            return Path(self._client.download_artifacts(run_id, path, str(dst)))
        return Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{model_id}",
                dst_path=str(dst),
                tracking_uri=self._store.settings.tracking_uri,
            )
        )

    def finished_cells(self, hashes: Iterable[str]) -> dict[str, RunRecord]:
        """Finished cell runs with one of these config hashes (the newest per hash)."""
        return self.reusable_cells(hashes, check_model=False)[0]

    def finished_cell_runs(self, hashes: Iterable[str]) -> dict[str, list[RunRecord]]:
        """Every finished cell run of each of these config hashes, newest first (one search;
        whose model loads is not checked: :meth:`first_usable`)."""
        wanted = set(hashes)
        found: dict[str, list[RunRecord]] = {}
        for r in self._store.search(
            _finished_of_kind("cell"), order_by=["attributes.start_time DESC"]
        ):
            h = r.data.tags.get(RunTags.CONFIG_HASH)
            if h in wanted:
                found.setdefault(h, []).append(_cell_record(r))
        return found

    def running_cells(self, hashes: Iterable[str]) -> dict[str, StoredRun]:
        """The RUNNING cell run of each of these config hashes (the newest where several; runs
        of processes that are gone were ended when the store was opened)."""
        wanted = set(hashes)
        found: dict[str, StoredRun] = {}
        running = f"tags.`{RunTags.KIND}` = 'cell' and attributes.status = 'RUNNING'"
        for r in self._store.search(running, order_by=["attributes.start_time DESC"]):
            h = r.data.tags.get(RunTags.CONFIG_HASH)
            if h in wanted and h not in found:
                found[h] = _stored_run(r)
        return found

    def metric_times(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """(step, seconds since the epoch as the store stamped it) of each value of a run's
        metric ``key``, by step."""
        history = self._client.get_metric_history(run_id, key)
        return sorted((int(m.step), m.timestamp / 1000) for m in history)

    def first_usable(
        self, records: Sequence[RunRecord]
    ) -> tuple[RunRecord | None, tuple[RunRecord, str] | None]:
        """``(usable, unusable)``: the first of ``records`` whose model artifact is present and
        loads (:meth:`model_problem`), and the first one before it that is not usable with what
        is wrong with it (each ``None`` when there is none)."""
        unusable = None
        for record in records:
            problem = self.model_problem(record)
            if problem is None:
                return record, unusable
            unusable = unusable or (record, problem)
        return None, unusable

    def reusable_cells(
        self, hashes: Iterable[str], *, check_model: bool = True
    ) -> tuple[dict[str, RunRecord], dict[str, tuple[RunRecord, str]]]:
        """``(reusable, unusable)``: per config hash, the newest finished cell run whose model
        artifact is present and loads (:meth:`model_problem`); and, for hashes that have
        finished runs but none with a usable model, the newest such run and what is wrong
        with it (the cell must be trained again). ``check_model=False``: any finished run."""
        found: dict[str, RunRecord] = {}
        broken: dict[str, tuple[RunRecord, str]] = {}
        for h, runs in self.finished_cell_runs(hashes).items():
            usable, unusable = self.first_usable(runs) if check_model else (runs[0], None)
            if usable is not None:
                found[h] = usable
            elif unusable is not None:
                broken[h] = unusable
        return found, broken

    def model_problem(self, record: RunRecord, artifact_path: str = "model") -> str | None:
        """Why the model logged by a finished cell run cannot be used, or ``None`` when it is
        present and loads. Local artifacts are loaded (:func:`tasks.modelio.load_model`: the
        weights read back into the model); a remote artifact store is only listed."""
        uri = record.artifact_uri or self.get_run_data(record.run_id).artifact_uri
        local = _local_path(uri)
        if local is None:
            try:
                listed = self._client.list_artifacts(record.run_id, artifact_path)
            except Exception as e:
                return f"its model cannot be listed ({type(e).__name__}: {_first_line(e)})"
            if listed or self._remote_logged_model(record.run_id):
                return None
            return f"its model is missing from the artifact store ({uri}/{artifact_path})"
        from tasks.modelio import load_model

        folder = local / artifact_path
        if not folder.is_dir():
            logged = self._logged_model_folders(record.run_id)
            if not logged:
                return f"its model folder {folder} is missing"
            folder = logged[0]
        try:
            load_model(folder)
        except Exception as e:
            return f"its model at {folder} does not load ({type(e).__name__}: {_first_line(e)})"
        return None

    def _remote_logged_model(self, run_id: str) -> bool:
        """Whether the run's MLflow 3 logged model lists its ``MLmodel`` in a remote artifact
        store (an ``mlflow-artifacts:`` server, an object store): listed, not loaded."""
        try:
            model_id = self.logged_model_id(run_id)
            if model_id is None:
                return False
            files = self._client.list_logged_model_artifacts(model_id)
        except Exception:
            return False
        return any(f.path == "MLmodel" for f in files)

    def _logged_model_folders(self, run_id: str) -> list[Path]:
        """Local artifact folders of MLflow 3 logged models whose source is ``run_id``."""
        try:
            models = self._client.search_logged_models(
                [self._store.experiment_id], filter_string=f"source_run_id = '{run_id}'"
            )
        except Exception:
            return []
        paths = [_local_path(m.artifact_location) for m in models]
        return [p for p in paths if p is not None and p.is_dir()]

    def child_runs(self, parent_run_id: str) -> list[StoredRun]:
        """The runs nested under ``parent_run_id`` (a command's cells, a study's trials)."""
        found = self._store.search(f"tags.`{RunTags.PARENT}` = '{parent_run_id}'")
        return [_stored_run(r) for r in found]

    def runs_by_id(self, run_ids: Iterable[str]) -> dict[str, StoredRun]:
        """The runs of these ids that exist, by id (one search per hundred ids, not one call
        per run)."""
        ids, found = sorted(set(run_ids)), {}
        for i in range(0, len(ids), 100):
            quoted = ", ".join(f"'{r}'" for r in ids[i : i + 100])
            for run in self._store.search(f"attributes.run_id IN ({quoted})"):
                found[run.info.run_id] = _stored_run(run)
        return found

    def latest_run(self, kind: str) -> str | None:
        """The newest FINISHED run of ``kind`` (a failed or interrupted one has no results)."""
        runs = self._client.search_runs(
            [self._store.experiment_id],
            filter_string=_finished_of_kind(kind),
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        return runs[0].info.run_id if runs else None

    def finished_runs(self, kind: str) -> list[StoredRun]:
        """Every FINISHED run of ``kind``, newest first."""
        found = self._store.search(_finished_of_kind(kind), order_by=["attributes.start_time DESC"])
        return [_stored_run(r) for r in found]

    def set_ui_view(self) -> str:
        """Make the MLflow UI open this experiment as a model-training one, with the results in
        view; returns the key of the saved view (the runs page's ``viewStateShareKey``).

        Two experiment tags, which the UI reads: ``mlflow.experimentKind`` (a model-training
        experiment, not a GenAI one) and a shared view state (what the UI's *Share* button
        saves) whose run table shows ``test_rmse``, the best validation RMSE, epochs and
        training time beside the system and method, and whose chart view opens on
        :func:`_results_charts`. Which sidebar a page opened without ``workflowType`` shows and
        the plain page's columns are the browser's own choices (MLflow keeps them in its local
        storage)."""
        columns = [
            "attributes.`Models`",
            "attributes.`Dataset`",
            f"tags.`{RunTags.SYSTEM}`",
            f"tags.`{RunTags.METHOD}`",
            f"tags.`{RunTags.SEED}`",
            *(
                f"metrics.`{m}`"
                for m in (
                    Metrics.TEST_RMSE,
                    Metrics.BEST_VAL_RMSE,
                    Metrics.EPOCHS_RUN,
                    Metrics.TRAIN_SECONDS,
                )
            ),
        ]
        view = {"selectedColumns": columns, "columnOrder": columns, **_results_charts()}
        exp = self._store.experiment_id
        self._client.set_experiment_tag(exp, ExperimentTags.KIND, ExperimentTags.MODEL_TRAINING)
        self._client.set_experiment_tag(
            exp, ExperimentTags.SHARED_VIEW + UI_VIEW_KEY, json.dumps(view)
        )
        return UI_VIEW_KEY

    @property
    def experiment_id(self) -> str:
        return self._store.experiment_id

    def run_url(self, ui_address: str, run_id: str) -> str:
        """The run's page in the MLflow UI served at ``ui_address``."""
        return f"{ui_address.rstrip('/')}/#/experiments/{self._store.experiment_id}/runs/{run_id}"

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of a logged metric, in step order."""
        return sorted(
            (m.step, float(m.value)) for m in self._client.get_metric_history(run_id, key)
        )
