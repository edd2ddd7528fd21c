"""Study configuration: a profile, resolved like the benchmark's, plus optional selections."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from flows._study_catalog import STUDY_CATALOG
from tasks.config import PAPER_BUDGET_PROFILES, Profile, RunConfig, resolve_config

__all__ = ["QUICK_TRAINING", "StudyConfig", "study_config"]

#: Training budget of every study cell in the ``quick`` profile, in place of the profile's own
#: equal-time budget: a study compares variants of one model, so its cells get equal epochs
#: (30, patience 10), and 20 s at most keeps all twelve studies within an hour on 2 cores.
QUICK_TRAINING: dict[str, Any] = {"epochs": 30, "patience": 10, "max_train_seconds": 20.0}


class StudyConfig(BaseModel):
    """A study run: the resolved profile plus optional system/method selections."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    study: str
    run: RunConfig
    systems: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None

    @property
    def profile(self) -> Profile:
        return self.run.profile


def study_config(
    study: str,
    profile: str | None = "quick",
    *,
    systems: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    device: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> StudyConfig:
    """Resolve a study's configuration (profile ← :data:`QUICK_TRAINING` ← ``overrides``).

    ``systems``/``methods`` are validated like the benchmark's (unknown names list the valid ones).
    At the paper's budget (``paper``, ``fair``) a study the paper averages over fewer runs than
    Table 3's five takes the paper's seeds (:attr:`~flows._study_catalog.StudyEntry.paper_seeds`,
    e.g. 3 for ``Table:AdditionalNoiseResult``) unless ``seeds`` are given.
    """
    entry = STUDY_CATALOG.get(study)
    if not seeds and (profile or "quick") in PAPER_BUDGET_PROFILES and entry is not None:
        seeds = entry.paper_seeds
    layer: dict[str, Any] = {"seeds": list(seeds) if seeds else None, "device": device}
    if (profile or "quick") == "quick":
        layer["training"] = dict(QUICK_TRAINING)
    if systems:
        layer["systems"] = list(systems)
    if methods:
        layer["methods"] = list(methods)
    for k, v in (overrides or {}).items():
        if isinstance(v, Mapping) and isinstance(layer.get(k), Mapping):
            layer[k] = {**layer[k], **v}
        else:
            layer[k] = v
    run = resolve_config(profile, None, layer)
    return StudyConfig(
        study=study,
        run=run,
        systems=tuple(systems) if systems else None,
        methods=tuple(methods) if methods else None,
    )
