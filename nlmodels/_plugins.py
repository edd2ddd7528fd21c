"""Models from other packages: an entry point of the group ``nllab.models`` named ``N`` provides
model ``N`` (its module registers ``N`` with ``@register_model``, or the entry point names the
:class:`~nlmodels.base.ForecastModel` subclass itself), and ``module:ClassName`` method names
(a class in any importable module, registered under that spelling on first use, so any
process that meets the name can build it again).

A plugin is imported only when its name is used, never to list names (the command line reads
them from the packages' metadata: :mod:`tasks.config.plugins`, which states the rule this module
applies when a name is used): a built-in name is never a plugin's, and a name two packages
claim is neither's (a ``ValueError`` naming both); ``module:ClassName`` reaches either.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from importlib.metadata import EntryPoint, entry_points

from nlmodels._registrar import keep_first_names

__all__ = ["MODEL_ENTRY_POINTS", "find_model", "model_sources"]

#: The entry point group of model plugins.
MODEL_ENTRY_POINTS = "nllab.models"

_LOCK = threading.RLock()
_SOURCES: dict[str, str] = {}  # model name -> where it came from (plugins and module:Class)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _package(ep: EntryPoint) -> str:
    return getattr(ep.dist, "name", None) or "?"


@functools.cache
def _claims(name: str, path: tuple[str, ...]) -> tuple[EntryPoint, ...]:
    """The entry points named ``name``, one per package, as installed on ``path``."""
    found = {(ep.value, _package(ep)): ep for ep in entry_points(group=MODEL_ENTRY_POINTS)}
    return tuple(ep for ep in found.values() if ep.name == name)


def _built_in(name: str, MODELS: dict[str, type]) -> bool:
    return name in MODELS and MODELS[name].__module__.split(".")[0] == "nlmodels"


def find_model(name: str, MODELS: dict[str, type]) -> None:
    """Make ``name`` known if a plugin or its ``module:ClassName`` spelling provides it (a
    name nothing provides is left to the caller); ``ValueError`` in one line when the plugin
    or module cannot be imported, provides no such model, or two packages claim the name."""
    if _built_in(name, MODELS):
        return  # a built-in name is never a plugin's
    if ":" in name:
        _import_class(name, MODELS)
        return
    claims = _claims(name, tuple(sys.path))
    if len(claims) > 1:
        named = " and ".join(f"{ep.value} (package {_package(ep)})" for ep in claims)
        raise ValueError(
            f"model name {name!r} is claimed by {named}: none is used by that name "
            "(name one as --methods MODULE:CLASS)"
        )
    if name not in MODELS and claims:
        _load(claims[0], MODELS)


def _load(ep: EntryPoint, MODELS: dict[str, type]) -> None:
    from nlmodels.base import ForecastModel

    where = f"model plugin {ep.name!r} ({ep.value}, package {_package(ep)})"
    with _LOCK:
        if ep.name in MODELS:
            return
        before = set(MODELS)
        try:
            loaded = ep.load()
        except Exception as err:
            for added in set(MODELS) - before:  # nothing of a half-imported plugin is kept
                del MODELS[added]
            raise ValueError(f"{where} cannot be imported: {_first_line(err)}") from None
        if isinstance(loaded, type) and issubclass(loaded, ForecastModel):
            MODELS.setdefault(ep.name, loaded)
        if ep.name not in MODELS:
            raise ValueError(f"{where} registers no model named {ep.name!r}")
        for added in set(MODELS) - before:
            _SOURCES[added] = f"plugin {ep.value} (package {_package(ep)})"


def _import_class(name: str, MODELS: dict[str, type]) -> None:
    from nlmodels.base import ForecastModel

    module, _, attr = name.partition(":")
    with _LOCK:
        if name in MODELS:
            return
        try:
            with keep_first_names():  # names its module claims too stay whoever's they were
                cls = getattr(importlib.import_module(module), attr)
        except Exception as err:
            raise ValueError(f"method {name!r} cannot be imported ({_first_line(err)})") from None
        if not (isinstance(cls, type) and issubclass(cls, ForecastModel)):
            raise ValueError(f"method {name!r} is not a ForecastModel subclass")
        MODELS.setdefault(name, cls)
        _SOURCES[name] = f"class {name}"


def model_sources() -> dict[str, str]:
    """Where each model not built into nlmodels that this process loaded came from."""
    return dict(_SOURCES)
