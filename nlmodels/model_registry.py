"""The model registry: :data:`MODELS`, ``@register_model(name)`` and
``build_model("node", state_dim=2)`` (the generic decorator is :mod:`nlmodels._registrar`)."""

from __future__ import annotations

from typing import Any

from nlmodels._registrar import name_registrar
from nlmodels.base import ForecastModel

__all__ = ["MODELS", "build_model", "register_model"]

#: registry name -> model class; each class takes ``state_dim`` first and paper sizes by default.
MODELS: dict[str, type[ForecastModel]] = {}

#: ``@register_model("name")``: class decorator adding a :class:`ForecastModel` to :data:`MODELS`
register_model = name_registrar(MODELS, "model", "registry_name")


def build_model(name: str, state_dim: int, **overrides: Any) -> ForecastModel:
    """Build a registered model with the paper's sizes, overriding any keyword argument."""
    if name not in MODELS:
        valid = ", ".join(sorted(MODELS))
        raise ValueError(f"unknown model {name!r}; valid models: {valid}")
    if int(state_dim) < 1:
        raise ValueError(f"state_dim must be >= 1, got {state_dim}")
    return MODELS[name](int(state_dim), **overrides)
