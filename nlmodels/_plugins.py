"""Models from other packages: the entry point group ``nllab.models`` (a module that registers
:class:`~nlmodels.base.ForecastModel` subclasses with ``@register_model``) and
``module:ClassName`` method names (a class in any importable module, registered under that
spelling on first use, so any process that meets the name can build it again).

A plugin that fails to import, or registers a name already taken, is named in one line on
stderr (once per process) and left out; the built-in models and the other plugins still work.
"""

from __future__ import annotations

import importlib
import sys
import threading
from importlib.metadata import entry_points

from nlmodels._registrar import DuplicateName

__all__ = ["MODEL_ENTRY_POINTS", "find_model", "load_plugins", "model_sources", "plugin_problems"]

#: The entry point group of model plugins.
MODEL_ENTRY_POINTS = "nllab.models"

_LOCK = threading.RLock()
_LOADED = False
_PROBLEMS: list[str] = []
_SOURCES: dict[str, str] = {}  # model name -> where it came from (plugins and module:Class)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def load_plugins(MODELS: dict[str, type]) -> None:
    """Import every ``nllab.models`` entry point once per process (into the registry
    ``MODELS``, where the built-in models are already)."""
    global _LOADED
    with _LOCK:
        if _LOADED:
            return
        _LOADED = True
        for ep in sorted(entry_points(group=MODEL_ENTRY_POINTS), key=lambda e: e.name):
            dist = getattr(ep.dist, "name", None) or "?"
            before = dict(MODELS)
            try:
                ep.load()
            except Exception as err:
                # a half-imported plugin keeps nothing it registered before failing; a name two
                # plugins claim is neither's (which one a run used would depend on the order)
                for name in set(MODELS) - set(before):
                    del MODELS[name]
                if isinstance(err, DuplicateName) and err.name in _SOURCES:
                    del MODELS[err.name], _SOURCES[err.name]
                problem = (
                    f"model plugin {ep.name!r} ({ep.value}, package {dist}) is left out: "
                    f"{_first_line(err)}"
                )
                _PROBLEMS.append(problem)
                print(f"nllab: {problem}", file=sys.stderr)
                continue
            for name in set(MODELS) - set(before):
                _SOURCES[name] = f"plugin {ep.value} (package {dist})"


def find_model(name: str, MODELS: dict[str, type]) -> None:
    """Make ``name`` known if a plugin or its ``module:ClassName`` spelling provides it;
    raises ``ValueError`` when ``module:ClassName`` cannot be imported or is not a model."""
    from nlmodels.base import ForecastModel

    if name in MODELS:
        return
    load_plugins(MODELS)
    if name in MODELS or ":" not in name:
        return
    module, _, attr = name.partition(":")
    with _LOCK:
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as err:
            raise ValueError(f"method {name!r} cannot be imported ({_first_line(err)})") from None
        if not (isinstance(cls, type) and issubclass(cls, ForecastModel)):
            raise ValueError(f"method {name!r} is not a ForecastModel subclass")
        MODELS.setdefault(name, cls)
        _SOURCES[name] = f"class {name}"


def model_sources() -> dict[str, str]:
    """Where each model not built into nlmodels came from (after :func:`load_plugins`)."""
    return dict(_SOURCES)


def plugin_problems() -> tuple[str, ...]:
    """The one-line reason of each plugin left out (after :func:`load_plugins`)."""
    return tuple(_PROBLEMS)
