"""MLflow run names of cells: what a person reads in the UI's run list."""

from __future__ import annotations

import json

from tasks.config import CellConfig, non_default_overrides
from tasks.config.mlflow_names import name_token

__all__ = ["cell_variant", "run_name"]


def run_name(cell: CellConfig, variant: str | None = None) -> str:
    """The MLflow run name of a cell: method and variant first, so runs read apart in the UI's
    truncated name column: ``neural_laplace · lotka_volterra_dde · s0 · stereographic=False``.
    ``variant`` defaults to :func:`cell_variant`. Method and system appear as their MLflow
    name tokens (:mod:`tasks.config.mlflow_names`: the built-in names unchanged)."""
    variant = cell_variant(cell) if variant is None else variant
    parts = [name_token(cell.method), name_token(cell.system), f"s{cell.seed}"]
    if variant:
        parts.append(variant)
    return " · ".join(parts)


def cell_variant(cell: CellConfig) -> str:
    """What sets a cell apart from its model's defaults and clean data, e.g.
    ``latent_dim=4, noise_std=0.1`` (empty for a plain cell)."""
    parts = [
        f"{k}={json.dumps(v) if isinstance(v, list | tuple) else v}"
        for k, v in non_default_overrides(cell.method, cell.model).items()
    ]
    data = cell.data
    for name in ("noise_std", "n_train", "n_observed"):
        value = getattr(data, name)
        if value:
            parts.append(f"{name}={value}")
    if data.noise_effective:
        parts.append(f"noise_on={data.noise_on}")
    return ", ".join(parts)
