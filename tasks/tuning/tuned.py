"""Reading a study's best configuration back: for one (method, system), and for every cell of
a run (``nllab benchmark --tuned``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from pydantic import ValidationError

from tasks.config import CellConfig, ConfigError, RunConfig, validation_problems
from tasks.tuning.spec import BEST_ATTR, study_name
from tasks.tuning.storage import default_storage_url, open_storage

__all__ = ["TunedCells", "TunedOverrides", "apply_tuned", "tuned_overrides"]


@dataclass(frozen=True)
class TunedOverrides:
    """The best configuration of a study, as read back from its storage."""

    study_name: str
    best_value: float
    best_trial: int
    model: dict[str, Any]
    training: dict[str, Any]


def tuned_overrides(
    method: str, system: str, profile: str, storage: str | None = None, name: str | None = None
) -> TunedOverrides | None:
    """The best configuration of a finished study, or ``None`` if there is no such study."""
    url = storage or default_storage_url()
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return None
    name = name or study_name(method, system, profile)
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError:
        return None
    best = study.user_attrs.get(BEST_ATTR)
    if not best:
        return None
    return TunedOverrides(
        study_name=name,
        best_value=float(best["value"]),
        best_trial=int(best["trial"]),
        model=dict(best["overrides"]["model"]),
        training=dict(best["overrides"].get("training", {})),
    )


@dataclass(frozen=True)
class TunedCells:
    config: RunConfig  # the run with each tuned (system, method) in ``cell_overrides``
    cells: tuple[CellConfig, ...]
    tuned: tuple[str, ...]  # cell keys that use a study's best configuration
    untuned: tuple[str, ...]  # cell keys with no finished study (paper configuration)


def apply_tuned(
    config: RunConfig, storage: str | None = None, profile: str | None = None
) -> TunedCells:
    """``config`` with the best configuration of the study of each (method, system).

    Studies are looked up at ``profile`` (default: the config's own). A pair with no finished
    study keeps its configuration. Explicit per-method overrides of ``config`` win over tuned ones
    (:meth:`RunConfig.cells`).
    """
    profile = profile or config.profile
    overrides: dict[str, dict[str, Any]] = {}
    studies: dict[str, str] = {}
    for system in config.systems:
        for method in config.methods:
            best = tuned_overrides(method, system, profile, storage)
            if best is not None:
                overrides[f"{system}/{method}"] = {"model": best.model, "training": best.training}
                studies[f"{system}/{method}"] = best.study_name
    try:
        tuned_config = RunConfig.model_validate(
            {**config.model_dump(), "cell_overrides": overrides}
        )
        cells = tuned_config.cells()
    except ValidationError as e:
        raise ConfigError(
            f"the tuned configurations of studies {sorted(studies.values())} do not fit a cell "
            f"config: {'; '.join(validation_problems(e))}"
        ) from None
    tuned = tuple(c.key for c in cells if f"{c.system}/{c.method}" in overrides)
    untuned = tuple(c.key for c in cells if f"{c.system}/{c.method}" not in overrides)
    return TunedCells(tuned_config, tuple(cells), tuned, untuned)
