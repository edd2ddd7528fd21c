"""A trained model on disk: its state dict plus the config that rebuilds it as our class.

No pickled code: weights are read with ``torch.load(weights_only=True)`` and the module is rebuilt
with ``nlmodels.build_model``, so loading a model cannot run arbitrary code.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nlmodels import ForecastModel, build_model

__all__ = [
    "ModelSpec",
    "forecast",
    "load_model",
    "model_params",
    "resolved_model_args",
    "save_model",
    "weights_folder",
]

_WEIGHTS = "state_dict.pt"
_SPEC = "model.json"


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild and use a saved model."""

    method: str
    state_dim: int
    overrides: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float64"
    normaliser: dict[str, list[float]] = field(default_factory=dict)
    cell: dict[str, Any] = field(default_factory=dict)
    config_hash: str = ""
    dataset_fingerprint: str = ""
    test_rmse: float | None = None
    #: every constructor argument, defaults included (:func:`resolved_model_args`)
    model_args: dict[str, Any] = field(default_factory=dict)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def resolved_model_args(
    method: str, state_dim: int, overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """Every constructor argument of the registered model ``method``: its defaults (read with
    :func:`inspect.signature`, following ``**kwargs`` to the parent class) overridden by
    ``overrides``, as JSON values (tuples as lists). Nothing is built."""
    from nlmodels import MODELS, model_signature

    if method not in MODELS:
        raise ValueError(f"unknown model {method!r}; valid models: {', '.join(sorted(MODELS))}")
    empty = inspect.Parameter.empty
    defaults = {k: v for k, v in model_signature(method).items() if v is not empty}
    return _jsonable({"state_dim": int(state_dim), **defaults, **dict(overrides)})


def model_params(args: Mapping[str, Any]) -> dict[str, str]:
    """Resolved model arguments as MLflow params ``model.NAME``: lists and maps as JSON, the
    rest as ``str`` (the spelling of :meth:`tasks.config.CellConfig.flat_params`, so an override
    logged by both gets the same value)."""
    return {
        f"model.{k}": json.dumps(v) if isinstance(v, list | tuple | Mapping) else str(v)
        for k, v in args.items()
    }


def save_model(model: ForecastModel, spec: ModelSpec, folder: str | Path) -> Path:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save(state, out / _WEIGHTS)
    (out / _SPEC).write_text(json.dumps(asdict(spec), indent=2, sort_keys=True))
    return out


def weights_folder(folder: str | Path) -> Path:
    """Where :func:`save_model`'s files are: ``folder`` itself, or, for a model logged as an
    MLflow ``pyfunc``, its ``artifacts/weights`` folder."""
    folder = Path(folder)
    for candidate in (folder, folder / "artifacts" / "weights"):
        if (candidate / _SPEC).is_file() and (candidate / _WEIGHTS).is_file():
            return candidate
    raise FileNotFoundError(
        f"{str(folder)!r} is not a saved Neural Laplace Lab model (expected {_SPEC} and {_WEIGHTS})"
    )


def load_model(
    folder: str | Path, device: str | torch.device = "cpu"
) -> tuple[ForecastModel, ModelSpec]:
    """Rebuild a model saved by :func:`save_model` (weights-only load)."""
    folder = weights_folder(folder)
    spec = ModelSpec(**json.loads((folder / _SPEC).read_text()))
    model = build_model(spec.method, spec.state_dim, **spec.overrides)
    dtype = torch.float64 if spec.dtype == "float64" else torch.float32
    model.to(dtype=dtype)
    state = torch.load(folder / _WEIGHTS, map_location=device, weights_only=True)
    model.load_state_dict(state)
    model.to(device=torch.device(device))
    model.eval()
    return model, spec


@torch.no_grad()
def forecast(model: ForecastModel, spec: ModelSpec, inputs: Mapping[str, Any]) -> np.ndarray:
    """The model's extrapolation in physical units: ``inputs`` holds ``obs_t`` ``[n, T]``,
    ``obs_x`` ``[n, T, D]`` (physical units) and ``query_t`` ``[n, Tq]``; returns
    ``[n, Tq, D]``. Values are normalised with the run's own training statistics on the way in
    and mapped back on the way out."""
    from datasets import Normaliser
    from nltrain import DTYPES, as_tensor

    missing = {"obs_t", "obs_x", "query_t"} - set(inputs)
    if missing:
        raise ValueError(f"missing inputs {sorted(missing)}; expected obs_t, obs_x, query_t")
    normaliser = Normaliser.from_dict(spec.normaliser)
    device = next(model.parameters()).device

    def tensor(x: Any) -> torch.Tensor:
        # A writable copy in the model's dtype: any float input is cast, and arrays MLflow
        # hands over read-only never reach torch (which warns about them).
        return as_tensor(x, device, DTYPES[spec.dtype])

    obs_x = np.asarray(normaliser.transform(np.asarray(inputs["obs_x"])))
    pred = model(tensor(inputs["obs_t"]), tensor(obs_x), tensor(inputs["query_t"]))
    return np.asarray(normaliser.inverse_transform(pred.cpu().numpy()))
