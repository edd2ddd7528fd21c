"""The model registry: :data:`MODELS`, ``@register_model(name)`` and
``build_model("node", state_dim=2)`` (the generic decorator is :mod:`nlmodels._registrar`).

It also answers what a registered model accepts, read from its constructors without building
it (:func:`model_signature`, :func:`model_choices`, :func:`model_option_types`): the config
layer validates model options against these (``tasks.config``), and a cell's hash leaves out
the options equal to the model's own default (:func:`non_default_overrides`), in the manner of
torchdiffeq's solver table, where a name maps to a class whose keywords are its options.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import sys
import threading
import tomllib
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from nlmodels._plugins import find_model as _find_model
from nlmodels._plugins import model_sources
from nlmodels._registrar import name_registrar
from nlmodels.base import ForecastModel

__all__ = [
    "BUILTIN_CATALOG",
    "INIT_LOCK",
    "MODELS",
    "build_model",
    "find_model",
    "load_builtin_models",
    "model_arguments",
    "model_choices",
    "model_constructors",
    "model_names",
    "model_option_types",
    "model_signature",
    "model_sources",
    "non_default_overrides",
    "register_model",
    "registry_choices",
]

#: registry name -> model class; each class takes ``state_dim`` first and paper sizes by default.
MODELS: dict[str, type[ForecastModel]] = {}

#: ``@register_model("name")``: class decorator adding a :class:`ForecastModel` to :data:`MODELS`
register_model = name_registrar(MODELS, "model", "registry_name")

#: The built-in models' registration: one table per model (its module, label, whether it is a
#: row of the main table, its quick-profile epochs), read without torch by ``tasks.config.names``.
BUILTIN_CATALOG = Path(__file__).resolve().parent / "models.toml"


def _initializing(module: str) -> bool:
    spec = getattr(sys.modules.get(module), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def load_builtin_models() -> tuple[str, ...]:
    """Import the module of every model in :data:`BUILTIN_CATALOG` (each registers its class
    with :func:`register_model`); returns the catalog's names, in its order. A name the catalog
    lists but no module registers is an error (the two would disagree), unless its module is
    still being imported (it imported this registry first: it registers when it finishes)."""
    catalog = tomllib.loads(BUILTIN_CATALOG.read_text(encoding="utf-8"))
    for module in dict.fromkeys(entry["module"] for entry in catalog.values()):
        importlib.import_module(module)
    missing = [
        name
        for name, entry in catalog.items()
        if name not in MODELS and not _initializing(entry["module"])
    ]
    if missing:
        raise ImportError(
            f"{BUILTIN_CATALOG.name}: {', '.join(missing)} not registered by its module "
            "(@register_model(NAME) on the class)"
        )
    return tuple(catalog)


def find_model(name: str) -> None:
    """Make ``name`` known if a plugin (entry point group ``nllab.models``, imported only now)
    or its ``module:ClassName`` spelling provides it (:mod:`nlmodels._plugins`); ``ValueError``
    in one line when it cannot be imported, is no model, or two packages claim the name."""
    _find_model(name, MODELS)


def model_names() -> tuple[str, ...]:
    """The models registered in this process, sorted: the built-in ones and the plugins used
    so far (the installed plugins' names are in their metadata: ``tasks.config.plugins``)."""
    return tuple(sorted(MODELS))


#: Held while a model draws its initial weights from torch's process-wide generator (every
#: :func:`build_model`, and ``nltrain.seeded`` around its seeding and build): a model
#: built in one thread (a logged model loaded back, e.g. by MLflow's input-example check)
#: would otherwise draw between another thread's seeding and its build, and a seed would give
#: other initial weights.
INIT_LOCK = threading.RLock()


def build_model(name: str, state_dim: int, **overrides: Any) -> ForecastModel:
    """Build a registered model with the paper's sizes, overriding any keyword argument."""
    if name not in MODELS:
        find_model(name)
    if name not in MODELS:
        valid = ", ".join(sorted(MODELS))
        raise ValueError(f"unknown model {name!r}; valid models: {valid}")
    if int(state_dim) < 1:
        raise ValueError(f"state_dim must be >= 1, got {state_dim}")
    # each registered class takes the state dimension and keywords of its own
    model_class: Callable[..., ForecastModel] = MODELS[name]
    with INIT_LOCK:
        return model_class(int(state_dim), **overrides)


def model_constructors(method: str) -> list[Callable[..., None]]:
    """The ``__init__`` functions that take ``build_model(method, ...)``'s keywords: the
    model's own and, where it forwards ``**kwargs``, its bases'."""
    find_model(method)
    inits = []
    for klass in MODELS[method].__mro__:
        if "__init__" not in vars(klass):
            continue
        inits.append(vars(klass)["__init__"])
        kinds = (p.kind for p in inspect.signature(inits[-1]).parameters.values())
        if inspect.Parameter.VAR_KEYWORD not in kinds:
            break
    return inits


@functools.cache
def model_signature(method: str) -> dict[str, Any]:
    """Name -> default (``inspect.Parameter.empty`` when required) of every keyword argument
    ``build_model(method, state_dim, **kw)`` accepts, read from the model's constructors.
    Nothing is built; read once per method (the result is shared: do not modify it)."""
    params: dict[str, Any] = {}
    for init in model_constructors(method):
        for p in inspect.signature(init).parameters.values():
            named = p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            if named and p.name not in ("self", "state_dim"):
                params.setdefault(p.name, p.default)
    return params


def _type_hints(init: Callable[..., None]) -> dict[str, Any] | None:
    try:
        return typing.get_type_hints(init)
    except (NameError, TypeError):  # an annotation only a type checker resolves
        return None


@functools.cache
def model_choices(method: str) -> dict[str, tuple[Any, ...]]:
    """Name -> allowed values of every keyword argument of ``method`` annotated ``Literal``."""
    choices: dict[str, tuple[Any, ...]] = {}
    for init in model_constructors(method):
        for name, hint in (_type_hints(init) or {}).items():
            if typing.get_origin(hint) is Literal:
                choices.setdefault(name, typing.get_args(hint))
    return choices


@functools.cache
def model_option_types(method: str) -> dict[str, Any]:
    """Name -> type annotation of every keyword argument of ``method`` (the first constructor
    that names it, as :func:`model_signature` takes its default)."""
    hints: dict[str, Any] = {}
    for init in model_constructors(method):
        found = _type_hints(init)
        if found is None:
            continue
        for name in model_signature(method):
            if name in found:
                hints.setdefault(name, found[name])
    return hints


def model_arguments(method: str) -> tuple[str, ...]:
    """The keyword arguments ``build_model(method, state_dim, **kw)`` accepts."""
    return tuple(model_signature(method))


def registry_choices(method: str | None = None) -> dict[str, tuple[str, ...]]:
    """Options whose valid names are a registry's keys rather than a ``Literal`` annotation:
    the ODE solvers of the baselines and the ILT algorithms (for ``method``, the linear ones
    only where its model says :attr:`~nlmodels.base.ForecastModel.linear_ilt_only`)."""
    from nlmodels.baselines._solve import SOLVERS
    from nlmodels.ilt import ILT_ALGORITHMS

    linear_only = False
    if method is not None:
        find_model(method)
        linear_only = bool(getattr(MODELS[method], "linear_ilt_only", False))
    ilts = sorted(n for n, c in ILT_ALGORITHMS.items() if c.is_linear or not linear_only)
    return {"solver": tuple(SOLVERS), "ilt": tuple(ilts)}


def _json_value(v: Any) -> Any:
    try:
        return json.loads(json.dumps(v))
    except TypeError:
        return repr(v)  # a default that is not a plain value never equals an override


def non_default_overrides(method: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The model overrides whose value differs from the model's own default (compared as JSON,
    so a tuple equals the list default it spells); all of them for an unknown method."""
    try:
        find_model(method)  # a plugin's defaults count as the built-ins' do
    except ValueError:
        pass
    defaults = model_signature(method) if method in MODELS else {}
    return {
        k: v
        for k, v in overrides.items()
        if k not in defaults or json.dumps(_json_value(v)) != json.dumps(_json_value(defaults[k]))
    }


load_builtin_models()  # every model of models.toml registers itself with this registry
