"""Installed plugins read from their packages' entry-point metadata, without importing any:
models (group ``nllab.models``) and simulators (``nllab.systems``), each named by its entry
point, with the distribution (package) that installed it.

The rule when names collide: a built-in name always wins (a plugin claiming it is left out and
named with its package); a name two or more packages claim is left out for all of them, each
named with its package (which one a run used would otherwise depend on the install order).
``module:Class`` (models) or ``simulator = "module:function"`` (systems) still reaches any of
them. :func:`nlmodels.model_registry.find_model` and the simulator lookup of
:mod:`datasets` refuse a claimed name by the same rule when it is used.

Standard library only: the command line lists and checks names with it before numpy or torch
load.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points

__all__ = ["MODEL_GROUP", "SYSTEM_GROUP", "Plugin", "PluginTable", "plugin_table"]

MODEL_GROUP = "nllab.models"
SYSTEM_GROUP = "nllab.systems"
_KIND = {MODEL_GROUP: "model", SYSTEM_GROUP: "simulator"}
_PICK = {
    MODEL_GROUP: "name one as --methods MODULE:CLASS",
    SYSTEM_GROUP: 'declare one with simulator = "MODULE:FUNCTION"',
}


@dataclass(frozen=True)
class Plugin:
    """One entry point: the name it gives, what it points at, the package that installed it."""

    name: str
    value: str
    package: str

    def __str__(self) -> str:
        return f"{self.value} (package {self.package})"


@dataclass(frozen=True)
class PluginTable:
    """The plugins of one group: those usable by name, and one line for each name left out."""

    usable: dict[str, Plugin]
    left_out: dict[str, str]  # name -> why, in one line naming every package that claims it

    def problem(self, name: str) -> str | None:
        """Why ``name`` cannot be used by name (claimed twice, or a built-in's), or ``None``."""
        return self.left_out.get(name)


def _installed(group: str) -> tuple[Plugin, ...]:
    # the same package found twice on the path (an editable install and a copy) counts once
    found = {
        (ep.name, ep.value, getattr(ep.dist, "name", None) or "?")
        for ep in entry_points(group=group)
    }
    return tuple(Plugin(*f) for f in sorted(found))


@functools.cache
def _table(group: str, builtin: frozenset[str], path: tuple[str, ...]) -> PluginTable:
    """The table of ``group`` as installed on ``path`` (``sys.path``: a folder added to it may
    bring packages)."""
    claims: dict[str, list[Plugin]] = {}
    for plugin in _installed(group):
        claims.setdefault(plugin.name, []).append(plugin)
    usable, left_out = {}, {}
    kind, pick = _KIND.get(group, "plugin"), _PICK.get(group, "")
    for name, plugins in claims.items():
        named = " and ".join(map(str, plugins))
        if name in builtin:
            left_out[name] = (
                f"{kind} plugin {named} claims the built-in name {name!r}: the built-in is used"
            )
        elif len(plugins) > 1:
            left_out[name] = (
                f"{kind} name {name!r} is claimed by {named}: none is used by that name ({pick})"
            )
        else:
            usable[name] = plugins[0]
    return PluginTable(usable, left_out)


def plugin_table(group: str, builtin: Iterable[str] = ()) -> PluginTable:
    """The installed plugins of ``group`` under the rule of the module (``builtin``: the names
    the platform ships, which always win), read once per process and ``sys.path``."""
    return _table(group, frozenset(builtin), tuple(sys.path))
