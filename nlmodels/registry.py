"""Name registry of forecasting models: ``build_model("node", state_dim=2)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from nlmodels.base import ForecastModel

__all__ = ["MODELS", "build_model", "register_model"]

M = TypeVar("M", bound=type[ForecastModel])

#: registry name -> model class; each class takes ``state_dim`` first and paper sizes by default.
MODELS: dict[str, type[ForecastModel]] = {}


def register_model(name: str) -> Callable[[M], M]:
    """Class decorator adding a :class:`ForecastModel` subclass to :data:`MODELS`."""

    def decorate(cls: M) -> M:
        if name in MODELS and MODELS[name] is not cls:
            raise ValueError(f"model name {name!r} is already registered")
        cls.registry_name = name
        MODELS[name] = cls
        return cls

    return decorate


def build_model(name: str, state_dim: int, **overrides: Any) -> ForecastModel:
    """Build a registered model with the paper's sizes, overriding any keyword argument."""
    if name not in MODELS:
        valid = ", ".join(sorted(MODELS))
        raise ValueError(f"unknown model {name!r}; valid models: {valid}")
    if int(state_dim) < 1:
        raise ValueError(f"state_dim must be >= 1, got {state_dim}")
    return MODELS[name](int(state_dim), **overrides)
