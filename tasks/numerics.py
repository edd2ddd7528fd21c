"""Reuse by numerics: which stored cells today's code would compute differently.

The fingerprints themselves (a model's and a system's canary bytes, cached per source state)
are the training floor's (:func:`nltrain.model_fingerprint`, :func:`nltrain.system_fingerprint`);
here they are read for a run's cells, written as its tags and compared with a stored run's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nltrain import model_fingerprint, model_settings, system_fingerprint, training_digest

__all__ = [
    "CellNumerics",
    "cell_tags",
    "model_fingerprint",
    "stale",
    "system_fingerprint",
    "training_digest",
    "warm",
]


def _model_key(cell) -> tuple[str, str]:
    """The model a fingerprint tells apart: the method and its settings (canonical JSON)."""
    return cell.method, json.dumps(model_settings(cell.method, cell.model), sort_keys=True)


@dataclass(frozen=True)
class CellNumerics:
    """Today's fingerprints of the models (method and settings) and systems of some cells."""

    models: Mapping[tuple[str, str], str]
    systems: Mapping[str, str]

    def model(self, cell) -> str:
        """Today's fingerprint of ``cell``'s model, as its settings build it."""
        return self.models[_model_key(cell)]


def warm(cells: Iterable) -> CellNumerics:
    """Today's fingerprints of the models (with their settings) and systems of ``cells``
    (computed now if not cached, so worker processes then only read them)."""
    cells = list(cells)
    models = {_model_key(c): c for c in cells}
    systems = sorted({c.system for c in cells})
    return CellNumerics(
        {key: model_fingerprint(c.method, c.model) for key, c in sorted(models.items())},
        {s: system_fingerprint(s) for s in systems},
    )


def cell_tags(cell) -> dict[str, str]:
    """The ``numerics.model`` and ``numerics.system`` tags of a cell's run."""
    from tasks.tracking.tags import RunTags

    return {
        RunTags.NUMERICS_MODEL: model_fingerprint(cell.method, cell.model),
        RunTags.NUMERICS_SYSTEM: system_fingerprint(cell.system),
    }


def stale(
    cells: Iterable, records: Mapping[str, object], today: CellNumerics
) -> tuple[set[str], list[str]]:
    """Which stored runs (``records``: config hash → :class:`tasks.tracking.RunRecord`) were
    computed by other numerics than today's: their config hashes, and one line per changed
    model or system (and one for runs stored before fingerprints were recorded)."""
    from tasks.tracking.tags import RunTags

    out: set[str] = set()
    changed: dict[tuple[str, str], list[str]] = {}
    unrecorded = 0
    for c in cells:
        h = c.config_hash()
        record = records.get(h)
        if record is None or h in out:
            continue
        tags = record.tags
        model, system = tags.get(RunTags.NUMERICS_MODEL), tags.get(RunTags.NUMERICS_SYSTEM)
        if model is None or system is None:
            out.add(h)
            unrecorded += 1
            continue
        commit = (tags.get(RunTags.GIT_COMMIT) or "")[:7] or "unknown"
        if model != today.model(c):
            changed.setdefault((c.method, "model"), []).append(commit)
        if system != today.systems[c.system]:
            changed.setdefault((c.system, "data set"), []).append(commit)
        if model != today.model(c) or system != today.systems[c.system]:
            out.add(h)
    lines = [
        f"{'' if kind == 'model' else 'the data set '}{name} changed since commit "
        f"{max(set(commits), key=commits.count)}: {len(commits)} "
        f"cell{'s' if len(commits) != 1 else ''} retrained"
        for (name, kind), commits in sorted(changed.items())
    ]
    if unrecorded:
        lines.append(
            f"{unrecorded} finished cell{'s' if unrecorded != 1 else ''} stored without "
            "numerics fingerprints (before they were recorded) retrained; --reuse config "
            "reuses them"
        )
    return out, lines
