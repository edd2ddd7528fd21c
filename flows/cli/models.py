"""``nllab models``: the models a run can use: the built-in ones and those of plugins (entry
points of ``nllab.models``, or ``--methods module:ClassName``), with their source, options
(constructor keywords and defaults) and the paper's table where it has one. ``--names`` lists
the names without importing torch: the built-in ones and the plugins' entry points."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("models", help="list the models: built-in and from plugins")
    p.add_argument("--names", action="store_true", help="names only, without importing torch")
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    from tasks.config import BUILTIN_METHODS, METHODS

    if args.names:
        from importlib.metadata import entry_points

        plugins = [f"{ep.name} (plugin {ep.value})" for ep in entry_points(group="nllab.models")]
        print("\n".join([*sorted(BUILTIN_METHODS), *plugins]))
        return 0
    from nlmodels.model_registry import (
        model_names,
        model_signature,
        model_sources,
        plugin_problems,
    )
    from tasks import DEFAULT_QUICK_EPOCHS
    from tasks.config import QUICK_EPOCHS

    names = model_names()  # loads the plugins
    sources = model_sources()
    for name in names:
        paper = "Table 3" if name in METHODS else "—"
        source = sources.get(name, "built-in")
        epochs = QUICK_EPOCHS.get(name, DEFAULT_QUICK_EPOCHS)
        print(f"{name:<16} {source}; paper: {paper}; quick profile: {epochs} epochs")
        options = ", ".join(f"{k}={v!r}" for k, v in model_signature(name).items())
        print(f"{'':<16} options: {options or 'none'}")
    for problem in plugin_problems():
        print(f"left out: {problem}")
    return 0
