"""What can move a cell's numbers, found by what it is: the whole packages of the numeric floors
and a plugin model's whole package, walked file by file (never a list someone must keep).

The numeric floors are the training floor (``nltrain``), the models (``nlmodels``) and the data
(``datasets``); a model registered from elsewhere (an ``nllab.models`` plugin, a notebook's
module) adds the top-level package its class comes from, or its module where that is a single
module. Nothing of ``tasks`` or ``flows`` (orchestration, the command line, reports) is covered:
editing them cannot change a number, so it retrains nothing.

Every file of a package counts (code, native kernels, parameter tables such as the CME
coefficients), except caches and build products; the packages are read where this process
imported them from, so a copy first on ``sys.path`` is the code that is hashed.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

__all__ = ["NUMERIC_PACKAGES", "covered_sources", "plugin_package"]

#: The packages whose every file can move a number (the floors below ``tasks``).
NUMERIC_PACKAGES = ("nltrain", "nlmodels", "datasets")
#: Files of a package folder that are neither its code nor its data.
_NOT_SOURCE = frozenset({".pyc", ".pyo", ".so", ".pyd", ".o", ".dll", ".dylib"})


def _package_files(name: str) -> dict[str, Path]:
    """Every file of the imported top-level package (or single module) ``name``, by the name it
    is hashed under: ``name/relative/path`` (a module: its file name), so that the key does not
    depend on where the tree lies."""
    module = importlib.import_module(name)
    folders = getattr(module, "__path__", None)
    if folders is None:
        path = Path(getattr(module, "__file__", None) or "")
        return {path.name: path} if path.is_file() else {}
    out = {}
    for folder in folders:  # os.walk: a few times faster than Path.rglob, at every source key
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            inside = os.path.relpath(root, folder).replace(os.sep, "/")
            prefix = name if inside == "." else f"{name}/{inside}"
            for file in files:
                path = os.path.join(root, file)
                if (
                    os.path.splitext(file)[1] not in _NOT_SOURCE
                    and file != "__pycache__"
                    and os.path.isfile(path)
                ):
                    out[f"{prefix}/{file}"] = Path(path)
    return out


def plugin_package(method: str) -> str | None:
    """The top-level package (or module) model ``method``'s class comes from when that is not a
    numeric floor (a plugin), else None."""
    from nlmodels import MODELS

    top = MODELS[method].__module__.partition(".")[0]
    return None if top in NUMERIC_PACKAGES else top


def covered_sources(method: str | None = None) -> dict[str, Path]:
    """The files a fingerprint's source key hashes, by hashed name: every file of
    :data:`NUMERIC_PACKAGES`, and with ``method`` the whole package of a plugin model (a script's
    model: the script; a notebook's, without a file: nothing)."""
    out: dict[str, Path] = {}
    for name in NUMERIC_PACKAGES:
        out.update(_package_files(name))
    plugin = None if method is None else plugin_package(method)
    if plugin is not None:
        out.update(_package_files(plugin))
    return out
