"""How a study's cell differs from the profile's cell of its system, method and seed, as the
ledger names it (``section.key=value``), and that name read back as config layers."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.config import CellConfig

__all__ = ["variant_of", "variant_overrides"]


def variant_of(cell: CellConfig, base: CellConfig | None) -> str:
    """How ``cell`` differs from ``base`` (the profile's cell of its system, method and seed):
    ``section.key=value`` (JSON values) for each setting of its data, training and model that
    differs, sorted, ``; ``-joined; "" when it is that cell (the same config hash).
    :func:`variant_overrides` reads it back."""
    if base is None or cell.config_hash() == base.config_hash():
        return ""
    from tasks.config import non_default_overrides

    mine, theirs = cell.model_dump(mode="json"), base.model_dump(mode="json")
    for dump, c in ((mine, cell), (theirs, base)):
        dump["model"] = non_default_overrides(c.method, dump["model"])
    parts = []
    for section in ("data", "training", "model"):
        a, b = mine[section], theirs[section]
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                parts.append(f"{section}.{key}={json.dumps(a.get(key), sort_keys=True)}")
    return "; ".join(parts)


def variant_overrides(method: str, variant: str) -> dict[str, Any]:
    """A variant (:func:`variant_of`) as config layers: ``{"data": {...}, "training": {...},
    "models": {method: {...}}}`` (sections it does not name left out)."""
    layers: dict[str, dict[str, Any]] = {}
    for part in filter(None, variant.split("; ")):
        name, _, value = part.partition("=")
        section, _, key = name.partition(".")
        if section not in ("data", "training", "model") or not key or not value:
            raise ValueError(f"not a ledger variant: {variant!r}")
        layers.setdefault(section, {})[key] = json.loads(value)
    out: dict[str, Any] = {k: v for k, v in layers.items() if k != "model"}
    if "model" in layers:
        out["models"] = {method: layers["model"]}
    return out
