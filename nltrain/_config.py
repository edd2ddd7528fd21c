"""The training protocol's settings: :class:`TrainConfig`, and :class:`Settings`, the frozen,
strict base every configuration of the platform derives from (``tasks.config`` builds its run,
cell and data configurations on it).

Strict kinds: pydantic's lax mode reads ``true`` as the integer 1 and ``"128"`` as a number
(`pydantic: conversion table <https://docs.pydantic.dev/latest/concepts/conversion_table/>`_);
a setting's value must already be of its kind, checked before pydantic would convert it.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["MAX_BATCH", "MAX_EPOCHS", "Settings", "TrainConfig"]

#: Bounds of training values that no run could reach (the paper trains 1000 epochs in batches of
#: 128): a value past them is a typo, refused when the config is read.
MAX_EPOCHS = 1_000_000
MAX_BATCH = 1_048_576


def _spelled(value: Any) -> str:
    """A value as a config file spells it (``true``, ``"128"``)."""
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def coercion_problem(annotation: Any, value: Any) -> str | None:
    """Why ``value`` must not be coerced to ``annotation`` (``None`` if it may): pydantic's lax
    mode reads ``true`` as the integer 1 and ``"128"`` as a number; a config value must already
    be of its setting's kind (an integral float such as TOML's ``2e6`` still counts as one)."""
    if value is None:
        return None
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            return None
        annotation = args[0]
    if typing.get_origin(annotation) is tuple and isinstance(value, list | tuple):
        items = get_args(annotation)
        for i, item in enumerate(value):
            kind = items[0] if items[1:] == (Ellipsis,) else items[i] if i < len(items) else None
            if kind is not None and (problem := coercion_problem(kind, item)) is not None:
                return f"item {i + 1} {problem}"
        return None
    if annotation is bool and not isinstance(value, bool):
        return f"must be true or false, got {_spelled(value)}"
    if annotation in (int, float) and isinstance(value, bool | str):
        return f"must be {'an integer' if annotation is int else 'a number'}, got {_spelled(value)}"
    return None


class Settings(BaseModel):
    """Frozen, no unknown keys, no infinite or NaN number, strict kinds."""

    # allow_inf_nan=False: an infinite noise level or learning rate (TOML accepts `inf` and
    # `nan`) is refused with the field's name instead of failing deep inside a run.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_coercion(cls, value: Any, info: Any) -> Any:
        """Strict kinds: no bool -> int (``epochs = true`` is not 1 epoch), no string ->
        number or flag; checked before pydantic would convert the value."""
        field = cls.model_fields.get(info.field_name)
        if field is not None and (problem := coercion_problem(field.annotation, value)):
            raise ValueError(problem)
        return value


class TrainConfig(Settings):
    """Optimisation protocol (paper: Adam 1e-3, batch 128, clipping 1, float64, patience 100)."""

    epochs: int = Field(1000, ge=1, le=MAX_EPOCHS)
    patience: int | None = Field(100, ge=1, le=MAX_EPOCHS, description="None: no early stopping")
    batch_size: int = Field(128, ge=1, le=MAX_BATCH)
    lr: float = Field(1e-3, gt=0.0)
    grad_clip: float | None = Field(1.0, gt=0.0)
    dtype: Literal["float64", "float32"] = "float64"
    max_train_seconds: float | None = Field(
        None,
        gt=0.0,
        description="training seconds each cell gets (a profile's wall-clock budget); "
        "a pack of M cells trains up to M times as long",
    )

    def fixed_epochs(self, epochs: int | None = None) -> TrainConfig:
        """This protocol for exactly ``epochs`` epochs (default: its own), no early stopping or
        time budget ending it sooner: what the placement probes and timings measure."""
        n = self.epochs if epochs is None else epochs
        return self.model_copy(update={"epochs": n, "patience": None, "max_train_seconds": None})
