"""The cell in miniature: how a cell's settings become its numerics canaries'
(:mod:`nltrain.numerics._fingerprints`). A canary takes a cell's settings whole, by the fields of
its protocol (:class:`~nltrain.TrainConfig`) and the keywords of the data functions
(:func:`datasets.simulate`, :func:`datasets.prepare`), never from a list of the ones that
matter; only the settings that say how much (epochs, batch, trajectories) are the canaries'
own, and the stops are set where the canary's two epochs never reach them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "CANARY_NOISE",
    "CANARY_PROTOCOL",
    "canary_split",
    "canary_training",
    "canary_trajectories",
    "data_keywords",
    "settings_text",
]


def settings_text(settings: Mapping[str, Any]) -> str:
    """``settings`` as canonical JSON (sorted keys, tuples as lists): how a model's settings
    are told apart wherever fingerprints are keyed by them."""
    return json.dumps(dict(settings), sort_keys=True, default=repr)


def _same(a: Any, b: Any) -> bool:
    """Equal as settings are written (a tuple is its list)."""
    return settings_text({"v": a}) == settings_text({"v": b})


#: The canary's own protocol (its batch is the fingerprints' sizes'): two epochs, a step that
#: moves the weights measurably in them, no early stop or time budget (a cell's protocol
#: changes it: :func:`canary_training`).
CANARY_PROTOCOL: dict[str, Any] = {
    "epochs": 2,
    "patience": None,
    "lr": 1e-2,
    "grad_clip": 1.0,
}
#: The settings that only say how much a cell trains: the canary keeps its own sizes.
_OWN_SIZES = frozenset({"epochs", "batch_size"})
#: The stops a cell may have, as the canary has them where the cell does: beyond its two epochs
#: and any second it takes (their checks run; they never fire, so its bytes do not move).
_UNREACHED_STOPS: dict[str, Any] = {
    "patience": CANARY_PROTOCOL["epochs"],
    "max_train_seconds": 1e6,
}


def canary_training(training: Mapping[str, Any] | None) -> dict[str, Any]:
    """How the model canary's protocol differs from its own for a cell trained by ``training``
    (a :class:`~nltrain.TrainConfig`, or some of its fields; a field at its default counts as
    absent). Every setting is the cell's, a field added later included, except the sizes
    (epochs, batch size: the canary's own, which reach every branch of the kernels) and the
    stops (patience, a time budget: the canary has one where the cell has one, never reached).

    Raises:
        TypeError: neither a :class:`~nltrain.TrainConfig` nor a mapping.
        ValueError: a name that is not a field of :class:`~nltrain.TrainConfig`.
    """
    from nltrain._config import TrainConfig

    if training is None:
        return {}
    if not isinstance(training, TrainConfig | Mapping):
        raise TypeError(
            f"training must be a TrainConfig or a mapping of its fields, got {training!r}"
        )
    fields = training.model_dump() if isinstance(training, TrainConfig) else dict(training)
    unknown = sorted(set(fields) - set(TrainConfig.model_fields))
    if unknown:
        raise ValueError(
            f"unknown training setting(s) {', '.join(unknown)}; TrainConfig has "
            f"{', '.join(TrainConfig.model_fields)}"
        )
    default = TrainConfig()
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name in _OWN_SIZES:
            continue
        if name in _UNREACHED_STOPS:
            value = None if value is None else _UNREACHED_STOPS[name]
        elif _same(value, getattr(default, name)):
            continue
        if not _same(value, CANARY_PROTOCOL.get(name, getattr(default, name))):
            out[name] = value
    return out


#: The system canary's trajectories, and its noise where the cell has none (so that the noise
#: path runs).
_CANARY_TRAJECTORIES, CANARY_NOISE = 10, 0.01
#: The keywords of the data functions a cell passes that the canary sets itself.
_OWN_DATA = frozenset({"system", "seed", "workers", "ds"})


@functools.cache
def data_keywords() -> tuple[dict[str, Any], dict[str, Any]]:
    """The keywords of :func:`datasets.simulate` and of :func:`datasets.prepare` a cell
    passes, each with its default (read once per process, as every cell's data key asks:
    the result is shared, do not modify it)."""
    import inspect

    from datasets import prepare, simulate

    def keywords(fn: Callable[..., Any]) -> dict[str, Any]:
        parameters = inspect.signature(fn).parameters.items()
        return {name: p.default for name, p in parameters if name not in _OWN_DATA}

    return keywords(simulate), keywords(prepare)


def _training_count(n: int, fractions: Any) -> int:
    """The training trajectories of ``n`` split at ``fractions`` (0 where none can be)."""
    from datasets import split_sizes

    try:
        return split_sizes(n, tuple(fractions))[0]
    except (TypeError, ValueError):
        return 0


def canary_trajectories(fractions: Any) -> int:
    """The system canary's trajectories: 10, or the fewest more, up to a paper-sized data set,
    that the cell's ``fractions`` split with two or more training trajectories (past that the
    canary's split fails, and says so, as the cell's would)."""
    n = _CANARY_TRAJECTORIES
    while fractions is not None and n <= 1000:
        if _training_count(n, fractions) >= 2:
            return n
        n *= 2
    return _CANARY_TRAJECTORIES


def canary_split(data: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keywords of :func:`datasets.simulate` and :func:`datasets.prepare` the system
    canary passes besides its own for a cell whose data are made with ``data`` (those
    functions' keywords as the cell passes them, e.g. a data configuration's fields but its
    source; one at the function's default counts as absent). Every one is the cell's, one added
    to the functions later included, except how many trajectories: the canary simulates its
    own few (:func:`canary_trajectories`) and sub-samples three quarters of its training ones
    where the cell takes ``n_train``.

    Raises:
        TypeError: not a mapping (e.g. a normalisation alone: ``{"normalise_on": "all"}``).
        ValueError: a name that is no keyword of those functions.
    """
    if not data:
        return {}
    if not isinstance(data, Mapping):
        raise TypeError(
            "data must be a mapping of datasets.simulate/prepare keywords, e.g. "
            f"{{'normalise_on': 'all'}}, got {data!r}"
        )
    simulated, prepared = data_keywords()
    keywords = {**simulated, **prepared}
    unknown = sorted(set(data) - set(keywords))
    if unknown:
        raise ValueError(
            f"unknown data setting(s) {', '.join(unknown)}; simulate and prepare take "
            f"{', '.join(keywords)}"
        )
    out = {
        name: value
        for name, value in data.items()
        if name != "n_trajectories" and not _same(value, keywords[name])
    }
    if "n_train" in out:
        fractions = out.get("fractions", keywords["fractions"])
        n = canary_trajectories(out.get("fractions"))
        out["n_train"] = max(1, _training_count(n, fractions) * 3 // 4)
    return out
