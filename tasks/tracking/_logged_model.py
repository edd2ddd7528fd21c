"""A saved model logged as an MLflow 3 *logged model* of its run, with the ``pyfunc`` flavour's
own logging: an ``MLmodel`` with a tensor signature and an input example, the model code of
:mod:`tasks.tracking.pyfunc_model` (no pickle) and the weights as its ``weights`` artifact.
``predict({"obs_t", "obs_x", "query_t"})`` returns the extrapolation."""

from __future__ import annotations

import json
import shutil
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlflow

from tasks.config.mlflow_names import logged_model_name
from tasks.tracking._store import Store
from tasks.tracking.tags import RunTags

__all__ = ["log_pyfunc_model"]


def _signature_and_example(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The tensor signature of ``predict`` and one input example: one trajectory of 8 observed
    points (the training set's mean state) and 4 queries after them, small, in physical units,
    and checked by MLflow against the model."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

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
    mean = np.asarray(spec.get("normaliser", {}).get("mean", [0.0] * dim), dtype=f64)
    example = {
        "obs_t": np.linspace(0.0, 1.0, 8)[None],
        "obs_x": np.broadcast_to(mean.reshape(1, 1, -1), (1, 8, dim)).copy(),
        "query_t": np.linspace(1.25, 2.0, 4)[None],
    }
    return signature, example


def _requirements() -> list[str]:
    found = []
    for package in ("torch", "numpy", "neural-laplace-lab"):
        try:
            found.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            found.append(package)
    return found


def _create_logged_model(store: Store, run_id: str, spec: dict[str, Any], artifact_path: str):
    """The logged model's record: it carries the run's params and cell tags, named after the
    cell (``neural_laplace-integro_de-s0``; ``artifact_path`` for a run without those tags),
    so the experiment's Models tab lists it."""
    run = store.client.get_run(run_id)
    method, system, seed = (
        run.data.tags.get(k) for k in (RunTags.METHOD, RunTags.SYSTEM, RunTags.SEED)
    )
    name = (
        logged_model_name(method, system, int(seed))
        if method and system and seed
        else artifact_path
    )
    return store.client.create_logged_model(
        store.experiment_id,
        name=name,
        source_run_id=run_id,
        params=dict(run.data.params),
        tags={
            k: run.data.tags[k]
            for k in (RunTags.SYSTEM, RunTags.METHOD, RunTags.SEED)
            if k in run.data.tags
        },
        model_type=str(spec.get("method", "")) or None,
    )


def log_pyfunc_model(store: Store, run_id: str, folder: Path, artifact_path: str) -> str:
    """Log the saved model in ``folder`` as a logged model of ``run_id``; its id."""
    from mlflow.entities import LoggedModelStatus
    from mlflow.models import Model

    # The signature is given explicitly; the pyfunc's ``predict`` has no input hint, so MLflow
    # infers none (no warning that it cannot: no ``warnings`` filters, which threads share).
    spec = json.loads((folder / "model.json").read_text())
    signature, example = _signature_and_example(spec)
    logged = _create_logged_model(store, run_id, spec, artifact_path)
    code = Path(__file__).resolve().parent / "pyfunc_model.py"
    with tempfile.TemporaryDirectory(prefix="nllab-pyfunc-") as tmp:
        # MLflow keeps an artifact folder's own name: copy it as "weights".
        weights = shutil.copytree(folder, Path(tmp) / "weights")
        # The pyfunc flavour's own logging (what mlflow.pyfunc.log_model runs), with the run
        # named explicitly: cells log from worker threads, which have no active run. It links
        # the model to the run and sets the MLmodel's run_id.
        mlflow.set_tracking_uri(store.settings.tracking_uri)
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
            pip_requirements=_requirements(),
        )
    store.client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    return logged.model_id
