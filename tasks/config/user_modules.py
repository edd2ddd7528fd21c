"""Where the user's code named ``module:Class`` (a model) or ``module:function`` (a simulator) is
looked up: in Python's path first (installed packages, ``PYTHONPATH``), then in the config
file's folder, then in the working directory. A module found only in one of those folders
puts it at the end of ``sys.path``, so worker processes (which start with this process's
path) and later imports find it too; a module found nowhere is one line naming the places.

Why both folders: a config file names its data files relative to its own folder, and the
code beside them belongs to it; a name typed on the command line (``--methods
mymodel:Net``) means the folder the user stands in. Python's path comes first, so an
installed package is never shadowed by a file of the same name lying about.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["find_user_modules", "user_code_names"]


def user_code_names(raw: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(key, spelled name)`` of every ``module:attr`` a raw run config names: methods (also
    as keys of ``models`` and ``method_epochs``) and declared simulators."""
    for key in ("methods", "models", "method_epochs"):
        names = raw.get(key)
        for name in names if isinstance(names, list | tuple | Mapping) else ():
            if isinstance(name, str) and ":" in name:
                yield key, name
    defs = raw.get("define_systems")
    for system, d in defs.items() if isinstance(defs, Mapping) else ():
        target = d.get("simulator") if isinstance(d, Mapping) else None
        if isinstance(target, str) and ":" in target:
            yield f"define_systems.{system}.simulator", target


def _on_path(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _holds(folder: Path, module: str) -> bool:
    return (folder / f"{module}.py").is_file() or (folder / module).is_dir()


def find_user_modules(raw: Mapping[str, Any], config_file: str | Path | None = None) -> None:
    """Make the top-level module of every ``module:attr`` in ``raw`` importable (see the
    module); ``ValueError`` in one line, naming the key and the places looked in, for one that
    is nowhere."""
    folders = [("the working directory", Path.cwd())]
    if config_file is not None:
        folders.insert(0, ("the config file's folder", Path(config_file).resolve().parent))
    for key, spelled in user_code_names(raw):
        top = spelled.partition(":")[0].split(".")[0]
        if not top or _on_path(top):
            continue
        found = next((f for _, f in folders if _holds(f, top)), None)
        if found is None:
            places = [f"{label} ({folder})" for label, folder in folders]
            raise ValueError(
                f"{key}: {spelled!r}: no module {top!r} in Python's path (installed packages, "
                f"PYTHONPATH), {' or '.join(places)}"
            )
        if str(found) not in sys.path:
            sys.path.append(str(found))
            importlib.invalidate_caches()
