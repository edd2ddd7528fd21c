"""``name_registrar``: the generic name → class decorator factory behind the two registries
(models in :mod:`nlmodels.model_registry`, ILT algorithms in :mod:`nlmodels.ilt`); it holds no
registry itself."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

C = TypeVar("C", bound=type)


class DuplicateName(ValueError):
    """A second class registered under a name already taken (the message names both)."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


_LENIENT = threading.local()


@contextlib.contextmanager
def keep_first_names() -> Iterator[None]:
    """While a module is imported for one of its classes (``module:Class``), a name it
    registers that another class holds already stays the other's (no error): the class asked
    for is reached by its spelling, whatever names its module also claims."""
    before = getattr(_LENIENT, "on", False)
    _LENIENT.on = True
    try:
        yield
    finally:
        _LENIENT.on = before


def name_registrar(
    table: dict[str, type], kind: str, attribute: str
) -> Callable[[str], Callable[[C], C]]:
    """``register(name)`` class decorators that add a class to ``table`` under ``name`` and store
    the name in the class attribute ``attribute``; two classes under one name is an error."""

    def register(name: str) -> Callable[[C], C]:
        def decorate(cls: C) -> C:
            if name in table and table[name] is not cls:
                if getattr(_LENIENT, "on", False):
                    return cls
                old, new = (f"{c.__module__}.{c.__qualname__}" for c in (table[name], cls))
                raise DuplicateName(
                    f"{kind} name {name!r} is registered twice: by {old} and by {new}", name
                )
            setattr(cls, attribute, name)
            table[name] = cls
            return cls

        return decorate

    return register
