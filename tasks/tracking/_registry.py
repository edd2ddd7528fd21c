"""The model registry of the MLflow adapter: each system's champion, promoted only when beaten,
and registered models read back by ``models:/`` URI."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException

from tasks.tracking._queries import Queries
from tasks.tracking._store import Store
from tasks.tracking.model_uri import parse_model_uri
from tasks.tracking.records import RunRecord
from tasks.tracking.tags import Metrics, RunTags

__all__ = ["CHAMPION", "Promotion", "Registry"]

#: The registry alias of each registered model's best version.
CHAMPION = "champion"


@dataclass(frozen=True)
class Promotion:
    """Outcome of a champion check in the model registry."""

    name: str
    promoted: bool
    version: str | None
    test_rmse: float
    previous_rmse: float | None


class Registry:
    """Registered models: promote a run's model, find the champion, read a version back."""

    def __init__(self, store: Store, queries: Queries) -> None:
        self._store = store
        self._client = store.client
        self._queries = queries

    def promote_if_better(
        self,
        name: str,
        run_id: str,
        test_rmse: float,
        artifact_path: str = "model",
        *,
        method: str = "neural_laplace",
        system: str | None = None,
    ) -> Promotion:
        """Register ``run_id``'s model (a cell of ``method`` on ``system``) as a new version of
        ``name`` and move the champion alias to it, only if it beats the current champion's
        test RMSE (lower is better).

        The registry never points at nothing: a deleted run (or one whose model is gone) is
        never promoted, and a champion whose run was deleted (soft or purged) or whose model is
        gone is replaced by any usable run, even one of equal RMSE. Existing versions are never
        deleted or overwritten, and a run already registered under ``name`` (say, by a process
        killed before it moved the alias) is not registered again: its version is reused.
        """
        if self.run_problem(run_id, artifact_path) is not None:
            return Promotion(name, False, None, test_rmse, None)
        self._create(name, method, system)
        aliases = self._client.get_registered_model(name).aliases
        previous: float | None = None
        if CHAMPION in aliases:
            current = self._client.get_model_version(name, aliases[CHAMPION])
            if current.run_id == run_id:
                return Promotion(name, False, str(current.version), test_rmse, test_rmse)
            previous = float(current.tags.get(Metrics.TEST_RMSE, "inf"))
            gone = current.run_id and self.run_problem(current.run_id, artifact_path)
            if not gone and not test_rmse < previous:
                return Promotion(name, False, None, test_rmse, previous)
        same_run = self._client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
        if same_run:
            version = str(min(int(v.version) for v in same_run))
        else:
            version = str(self._register(name, run_id, artifact_path, test_rmse))
        if model_id := self._queries.logged_model_id(run_id):
            self._link_version(model_id, name, version)
        self._client.set_registered_model_alias(name, CHAMPION, version)
        return Promotion(name, True, version, test_rmse, previous)

    def _create(self, name: str, method: str, system: str | None) -> None:
        """The registered model ``name`` (if new), tagged with its method and system as written
        (its name is their MLflow token: :mod:`tasks.config.mlflow_names`)."""
        where = f" on {system}" if system else " of this system"
        tags = {RunTags.METHOD: method, **({RunTags.SYSTEM: system} if system else {})}
        try:
            self._client.create_registered_model(
                name,
                tags=tags,
                description=f"Best {method} model{where} (lowest test RMSE).",
            )
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise

    def run_problem(
        self, run_id: str, artifact_path: str = "model", *, allow_deleted: bool = False
    ) -> str | None:
        """Why ``run_id``'s model cannot serve (its run deleted, unless ``allow_deleted``;
        purged; or its model gone), or ``None``."""
        try:
            run = self._client.get_run(run_id)
        except MlflowException:
            return f"its run {run_id} no longer exists (deleted and purged)"
        if run.info.lifecycle_stage == "deleted" and not allow_deleted:
            return f"its run {run_id} is deleted"
        record = RunRecord(run_id, "", None, {}, {}, run.info.artifact_uri)
        return self._queries.model_problem(record, artifact_path)

    def _register(self, name: str, run_id: str, artifact_path: str, test_rmse: float) -> str:
        """A new version of ``name`` pointing at the run's logged model (``models:/<id>``), or,
        for a run whose model is only run artifacts, at ``runs:/<run id>/<artifact_path>``."""
        model_id = self._queries.logged_model_id(run_id)
        mv = self._client.create_model_version(
            name,
            source=f"models:/{model_id}" if model_id else f"runs:/{run_id}/{artifact_path}",
            run_id=run_id,
            tags={Metrics.TEST_RMSE: repr(float(test_rmse))},
            model_id=model_id,
        )
        return str(mv.version)

    def _link_version(self, model_id: str, name: str, version: str) -> None:
        """Record ``name`` version ``version`` on the logged model ``model_id``, as
        ``mlflow.register_model`` does (its tag ``mlflow.modelVersions``, a JSON list of
        ``{"name", "version"}``): the Models tab's "Registered models" column reads it.
        ``create_model_version`` alone leaves it unset. Idempotent, so a promotion resumed after
        an interruption links the version once."""
        from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

        tags = self._client.get_logged_model(model_id).tags
        linked = json.loads(tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
        entry = {"name": name, "version": int(version)}  # an int, as MLflow writes it
        if entry not in [{"name": e["name"], "version": int(e["version"])} for e in linked]:
            self._client.set_logged_model_tags(
                model_id, {MLFLOW_MODEL_VERSIONS: json.dumps([*linked, entry])}
            )

    def champion(self, name: str) -> tuple[str, str | None] | None:
        """``(version, run_id)`` of the champion of ``name`` (the run ``None`` for a version
        registered without one), or ``None``."""
        try:
            mv = self._client.get_model_version_by_alias(name, CHAMPION)
        except MlflowException:
            return None
        return str(mv.version), mv.run_id

    def model_version(self, uri: str) -> tuple[str, str, str | None]:
        """``(name, version, source run id)`` of a model URI (:data:`~tasks.tracking.model_uri.
        ACCEPTED`): a registered version's name and number; a logged model's or a run's model's
        name and an empty version.

        Raises ``LookupError`` in one line: a malformed URI says what is accepted; a missing
        registered version names the registered models."""
        try:
            parsed = parse_model_uri(uri)
        except ValueError as e:
            raise LookupError(str(e)) from None
        try:
            if parsed.kind == "alias":
                mv = self._client.get_model_version_by_alias(parsed.name, parsed.ref)
            elif parsed.kind == "version":
                mv = self._client.get_model_version(parsed.name, parsed.ref)
            elif parsed.kind == "logged":
                logged = self._client.get_logged_model(parsed.model_id)
                return logged.name, "", logged.source_run_id
            else:
                self._client.get_run(parsed.run_id)
                model_id = self._queries.logged_model_id(parsed.run_id)
                name = self._client.get_logged_model(model_id).name if model_id else "model"
                return name, "", parsed.run_id
        except MlflowException as e:
            where = f"at {uri!r} in {self._store.settings.tracking_uri}"
            first = e.message.splitlines()[0]
            if not parsed.registered:
                what = "logged model" if parsed.kind == "logged" else "run"
                raise LookupError(f"no {what} {where} ({first})") from None
            names = sorted(m.name for m in self._client.search_registered_models())
            raise LookupError(
                f"no registered model version {where} ({first}); "
                f"registered models: {', '.join(names) or 'none'}"
            ) from None
        return mv.name, str(mv.version), mv.run_id

    def download_model(self, uri: str, dst: str | Path | None = None) -> Path:
        """Download the model a model URI names (:meth:`model_version`'s forms)."""
        try:
            parsed = parse_model_uri(uri)
        except ValueError as e:
            raise LookupError(str(e)) from None
        dst = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix="nllab-model-"))
        if parsed.kind == "run":
            return self._queries.download(parsed.run_id, "model", dst)
        try:
            path = mlflow.artifacts.download_artifacts(
                artifact_uri=uri,
                dst_path=str(dst),
                tracking_uri=self._store.settings.tracking_uri,
                registry_uri=self._store.settings.tracking_uri,
            )
        except MlflowException as e:
            what = "registered model" if parsed.registered else "logged model"
            raise LookupError(f"no {what} at {uri!r}: {e.message}") from e
        return Path(path)
