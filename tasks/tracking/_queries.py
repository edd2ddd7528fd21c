"""Queries of the MLflow adapter: which cells are finished and reusable, which runs a command
left, and how the MLflow UI shows them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mlflow import MlflowClient

from tasks.tracking._store import _KIND_ML, _KIND_TAG
from tasks.tracking.tags import RunTags

__all__ = ["UI_VIEW_KEY", "RunRecord"]

#: Experiment tag prefix of a shared view state of the runs page (:meth:`set_ui_view`).
_SHARED_VIEW_TAG = "mlflow.sharedViewState."
#: The key of the results view of the runs page (``?viewStateShareKey=``).
UI_VIEW_KEY = "nllab-results"


@dataclass(frozen=True)
class RunRecord:
    """A finished cell found in the store."""

    run_id: str
    config_hash: str
    test_rmse: float | None
    tags: Mapping[str, str]
    metrics: Mapping[str, float] = field(default_factory=dict)
    artifact_uri: str | None = None


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


class _QueriesMixin:
    """Searches of the experiment's runs: finished cells, children, latest runs, the UI view."""

    client: MlflowClient

    if TYPE_CHECKING:

        @property
        def experiment_id(self) -> str: ...
        def logged_model_id(self, run_id: str) -> str | None: ...

    def _search(self, filter_string: str, order_by: list[str] | None = None) -> Iterator:
        token = None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                filter_string=filter_string,
                max_results=1000,
                order_by=order_by,
                page_token=token,
            )
            yield from page
            token = page.token
            if not token:
                return

    def finished_cells(self, hashes: Iterable[str]) -> dict[str, RunRecord]:
        """Finished cell runs with one of these config hashes (the newest per hash)."""
        return self.reusable_cells(hashes, check_model=False)[0]

    def reusable_cells(
        self, hashes: Iterable[str], *, check_model: bool = True
    ) -> tuple[dict[str, RunRecord], dict[str, tuple[RunRecord, str]]]:
        """``(reusable, unusable)``: per config hash, the newest finished cell run whose model
        artifact is present and loads (:meth:`model_problem`); and, for hashes that have
        finished runs but none with a usable model, the newest such run and what is wrong
        with it (the cell must be trained again). ``check_model=False``: any finished run."""
        wanted = set(hashes)
        found: dict[str, RunRecord] = {}
        broken: dict[str, tuple[RunRecord, str]] = {}
        runs = self._search(
            _finished_of_kind("cell"),
            order_by=["attributes.start_time DESC"],
        )
        for r in runs:
            h = r.data.tags.get(RunTags.CONFIG_HASH)
            if h not in wanted or h in found:
                continue
            record = RunRecord(
                r.info.run_id,
                h,
                r.data.metrics.get("test_rmse"),
                dict(r.data.tags),
                dict(r.data.metrics),
                r.info.artifact_uri,
            )
            problem = self.model_problem(record) if check_model else None
            if problem is None:
                found[h] = record
                broken.pop(h, None)
            else:
                broken.setdefault(h, (record, problem))
        return found, broken

    def model_problem(self, record: RunRecord, artifact_path: str = "model") -> str | None:
        """Why the model logged by a finished cell run cannot be used, or ``None`` when it is
        present and loads. Local artifacts are loaded (:func:`tasks.modelio.load_model`: the
        weights read back into the model); a remote artifact store is only listed."""
        uri = record.artifact_uri or self.client.get_run(record.run_id).info.artifact_uri
        local = _local_path(uri)
        if local is None:
            try:
                listed = self.client.list_artifacts(record.run_id, artifact_path)
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
            files = self.client.list_logged_model_artifacts(model_id)
        except Exception:
            return False
        return any(f.path == "MLmodel" for f in files)

    def _logged_model_folders(self, run_id: str) -> list[Path]:
        """Local artifact folders of MLflow 3 logged models whose source is ``run_id``."""
        try:
            models = self.client.search_logged_models(
                [self.experiment_id], filter_string=f"source_run_id = '{run_id}'"
            )
        except Exception:
            return []
        paths = [_local_path(m.artifact_location) for m in models]
        return [p for p in paths if p is not None and p.is_dir()]

    def child_runs(self, parent_run_id: str) -> list:
        return list(self._search(f"tags.`{RunTags.PARENT}` = '{parent_run_id}'"))

    def runs_by_id(self, run_ids: Iterable[str]) -> dict[str, object]:
        """The runs (``mlflow.entities.Run``) of these ids that exist, by id (one search per
        hundred ids, not one call per run)."""
        ids, found = sorted(set(run_ids)), {}
        for i in range(0, len(ids), 100):
            quoted = ", ".join(f"'{r}'" for r in ids[i : i + 100])
            for run in self._search(f"attributes.run_id IN ({quoted})"):
                found[run.info.run_id] = run
        return found

    def latest_run(self, kind: str) -> str | None:
        """The newest FINISHED run of ``kind`` (a failed or interrupted one has no results)."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=_finished_of_kind(kind),
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        return runs[0].info.run_id if runs else None

    def finished_runs(self, kind: str) -> list:
        """Every FINISHED run of ``kind``, newest first (``mlflow.entities.Run``)."""
        return list(
            self._search(
                _finished_of_kind(kind),
                order_by=["attributes.start_time DESC"],
            )
        )

    def set_ui_view(self) -> str:
        """Make the MLflow UI open this experiment as a model-training one, with the results in
        view; returns the key of the saved view (the runs page's ``viewStateShareKey``).

        Two experiment tags, which the UI reads: ``mlflow.experimentKind`` (a model-training
        experiment, not a GenAI one) and a shared view state (what the UI's *Share* button
        saves) whose run table shows ``test_rmse``, the best validation RMSE, epochs and
        training time beside the system and method. Which sidebar a page opened without
        ``workflowType`` shows and the plain page's columns are the browser's own choices
        (MLflow keeps them in its local storage); charts are left to the user."""
        columns = [
            "attributes.`Models`",
            "attributes.`Dataset`",
            f"tags.`{RunTags.SYSTEM}`",
            f"tags.`{RunTags.METHOD}`",
            f"tags.`{RunTags.SEED}`",
            "metrics.`test_rmse`",
            "metrics.`best_val_rmse`",
            "metrics.`epochs_run`",
            "metrics.`train_seconds`",
        ]
        view = {"selectedColumns": columns, "columnOrder": columns}
        self.client.set_experiment_tag(self.experiment_id, _KIND_TAG, _KIND_ML)
        self.client.set_experiment_tag(
            self.experiment_id, _SHARED_VIEW_TAG + UI_VIEW_KEY, json.dumps(view)
        )
        return UI_VIEW_KEY

    def run_url(self, ui_address: str, run_id: str) -> str:
        """The run's page in the MLflow UI served at ``ui_address``."""
        return f"{ui_address.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}"

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of a logged metric, in step order."""
        return sorted((m.step, float(m.value)) for m in self.client.get_metric_history(run_id, key))
