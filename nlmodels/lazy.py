"""Faces that load their names on first use (PEP 562, module ``__getattr__`` and ``__dir__``).

A package's face (its ``__init__``) names what other packages import, but importing the face
must not import what the names live in: ``nllab --help`` answers before torch, mlflow or prefect
load, and ``import nlmodels`` loads no torch. Every lazy face of the project's packages is made
here, so that they resolve names one way::

    __getattr__, __dir__ = lazy_face(__name__, {"LedgerRecord": "records", ...})

This module imports nothing but the standard library, so any floor may use it (``datasets``,
which imports no other floor, keeps its own few lines).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_face"]


def _module_path(package: str, module: str) -> str:
    """``module`` by its full name: one named inside ``package``'s top-level package is taken as
    is (``tasks.config``), any other as a module of ``package`` (``records``)."""
    if module.partition(".")[0] == package.partition(".")[0]:
        return module
    return f"{package}.{module}"


def lazy_face(
    package: str, where: Mapping[str, str], aliases: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``'s face.

    ``where`` maps each public name to the module that defines it (its full name, or its name
    inside ``package``); ``aliases`` maps a public name to its name in that module where the two
    differ. A name is imported on first use and then kept in the package's namespace, so the
    second use costs nothing; an unknown name is the ``AttributeError`` Python's own lookup
    raises, which ``hasattr`` and ``from package import name`` rely on.
    """
    namespace = vars(sys.modules[package])
    renamed = dict(aliases or {})

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(
            importlib.import_module(_module_path(package, module)), renamed.get(name, name)
        )
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
