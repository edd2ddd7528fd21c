"""A trained model on disk: its state dict plus the config that rebuilds it as our class.

No pickled code: weights are read with ``torch.load(weights_only=True)`` and the module is rebuilt
with ``nlmodels.build_model``, so loading a model cannot run arbitrary code.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from nlmodels import ForecastModel, build_model

__all__ = ["ModelSpec", "load_model", "save_model"]

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


def save_model(model: ForecastModel, spec: ModelSpec, folder: str | Path) -> Path:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save(state, out / _WEIGHTS)
    (out / _SPEC).write_text(json.dumps(asdict(spec), indent=2, sort_keys=True))
    return out


def load_model(
    folder: str | Path, device: str | torch.device = "cpu"
) -> tuple[ForecastModel, ModelSpec]:
    """Rebuild a model saved by :func:`save_model` (weights-only load)."""
    folder = Path(folder)
    if not (folder / _SPEC).is_file() or not (folder / _WEIGHTS).is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} is not a saved Neural Laplace Lab model "
            f"(expected {_SPEC} and {_WEIGHTS})"
        )
    spec = ModelSpec(**json.loads((folder / _SPEC).read_text()))
    model = build_model(spec.method, spec.state_dim, **spec.overrides)
    dtype = torch.float64 if spec.dtype == "float64" else torch.float32
    model.to(dtype=dtype)
    state = torch.load(folder / _WEIGHTS, map_location=device, weights_only=True)
    model.load_state_dict(state)
    model.to(device=torch.device(device))
    model.eval()
    return model, spec
