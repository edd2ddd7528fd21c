"""The cells the results ledger holds: Table 3, its ablation and the Laplace-domain peers
(:data:`PEERS`) beside it under one of the
profiles that train the paper's budget (:data:`LEDGER_PROFILES`: ``paper``, the reference code's
protocol, or ``fair``), each with today's config hash and numerics fingerprints, cached on disk
per code state. Both profiles share one ledger file: a record names its cell by config hash, so a
cell the two profiles configure alike (Neural Laplace, the Neural Flows) has one record serving
both.

The peers (Laplace-Net, the Laplace Neural Operator, the neural DDE) are the main table's models
that the paper does not run: they have no protocol of the reference code's, so ``paper`` and
``fair`` configure each of their cells alike (one record serves both, as Neural Laplace's), at
the paper's budget. They are not Table 3's: :meth:`LedgerScope.select` leaves them out unless
asked for, and they come after Table 3 and the ablations in the scope's order.

A config hash needs the models' defaults (torch) and a numerics fingerprint runs a canary, so
``nllab ledger status``/``table`` would load torch on every call. Instead :func:`ledger_scope`
computes them once per *code state* and keeps them beside the installation
(:func:`datasets.cache_folders`: ``<sys.prefix>/var/cache/nllab/ledger``, else
``$NLLAB_HOME/ledger``), where every home of the installation finds them; a later call
with the same code state reads one small JSON file (standard library only). The code state is a
hash of everything the hashes and fingerprints depend on: the sources of ``nlmodels``,
``datasets``, ``tasks`` (and ``nltrain`` where present), the torch and numpy builds, the CPU,
its C library and the environment that can move bytes (:func:`nlmodels.numerics_environment`),
installed plugins and the config file.
A config file that declares systems (their data files are hashed into the config hash) is
never cached.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datasets import cache_folders
from nlmodels import numerics_environment
from tasks.config.names import METHODS
from tasks.ledger.provenance import cell_numerics
from tasks.ledger.records import (
    ABLATIONS,
    PEERS,
    LedgerCell,
    LedgerScope,
    read_ledger,
)
from tasks.ledger.variants import variant_of

if TYPE_CHECKING:
    from tasks.config import CellConfig, RunConfig

__all__ = [
    "LEDGER_PROFILES",
    "PEERS",
    "StudyCells",
    "ledger_cell_configs",
    "ledger_scope",
    "paper_config",
    "scope_of",
]

#: The profiles whose cells the ledger keeps (:data:`tasks.config.PAPER_BUDGET_PROFILES`), the
#: default first.
LEDGER_PROFILES: tuple[str, ...] = ("paper", "fair")

_ROOT = Path(__file__).resolve().parents[2]
#: What the cached hashes and fingerprints depend on, besides the environment.
_PACKAGES = ("nlmodels", "datasets", "tasks", "nltrain")
_SUFFIXES = (".py", ".c", ".h", ".yaml", ".toml")
#: Bumped when the cached file's content changes.
_FORMAT = 2


@dataclass(frozen=True)
class StudyCells:
    """The cells of the paper's other tables (its studies), as the floor that defines the
    studies plans them (:func:`flows.studies.ledger_study_cells`): ``cells(profile)`` lists
    ``(study, measure, cell)`` in the ledger's order (``measure``: what a record of the cell must
    have measured, "" for the test RMSE alone); ``sources``: the files and folders they are
    defined in, part of the cached scope's key."""

    cells: Callable[[str], Sequence[tuple[str, str, CellConfig]]]
    sources: tuple[Path, ...]


def paper_config(
    overrides: dict[str, Any] | None = None,
    *,
    config_file: str | Path | None = None,
    profile: str = "paper",
    **more: Any,
) -> RunConfig:
    """The ledger's ``profile`` (:data:`LEDGER_PROFILES`; default ``paper``), with
    ``config_file`` layered on it and the ``overrides`` (selection, execution; keyword arguments
    join them) on top."""
    from tasks.config import ConfigError, resolve_config

    if profile not in LEDGER_PROFILES:
        raise ConfigError(
            f"the ledger keeps the profiles {', '.join(LEDGER_PROFILES)}, not {profile!r}"
        )
    return resolve_config(profile, config_file, {**(overrides or {}), **more})


def ledger_cell_configs(
    config_file: str | Path | None = None,
    *,
    systems: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    profile: str = "paper",
) -> list[tuple[CellConfig, str]]:
    """The ledger's cells as configs: ``profile``'s (``config_file`` layered on it; the
    ``systems``, ``methods`` and ``seeds`` asked for, None: its own), then each ablation's,
    then the peers' (:data:`PEERS`), each with its ablation's key ("" for Table 3 and the
    peers). Loads the models (torch)."""
    selection: dict[str, Any] = {"systems": systems, "profile": profile}
    if seeds is not None:
        selection["seeds"] = list(seeds)
    table3 = None if methods is None else [m for m in methods if m not in PEERS]
    tagged: list[tuple[CellConfig, str]] = []
    if table3 != []:
        base = paper_config(config_file=config_file, methods=table3, **selection)
        tagged += [(c, "") for c in base.cells() if c.method not in PEERS]
    for key, overrides in ABLATIONS.items():
        wanted = [m for m in overrides if methods is None or m in methods]
        if wanted:
            config = paper_config(
                config_file=config_file, methods=wanted, models=overrides, **selection
            )
            tagged += [(c, key) for c in config.cells()]
    peers = [m for m in PEERS if methods is None or m in methods]
    if peers:
        config = paper_config(config_file=config_file, methods=peers, **selection)
        tagged += [(c, "") for c in config.cells()]
    return tagged


def scope_of(
    config_file: str | Path | None = None,
    systems: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    *,
    numerics: Callable[[CellConfig], str | None] | None = None,
    profile: str = "paper",
    studies: StudyCells | None = None,
) -> LedgerScope:
    """The scope computed now: ``profile``'s cells (``config_file`` layered on it, the
    ``systems``/``methods`` asked for, None: its own), those of each ablation and the peers',
    then, given ``studies`` and no config file, the studies' cells (each tagged with how it
    differs from the profile's cell: :func:`~tasks.ledger.variants.variant_of`), with
    ``numerics(cell)`` (today's fingerprints) if given. Loads the models (torch)."""
    from tasks.config.names import SYSTEM_NAMES, plugin_systems

    base = paper_config(config_file=config_file, systems=systems, methods=methods, profile=profile)
    rows = _scope_rows(config_file, systems, methods, profile, studies)
    cells = tuple(
        LedgerCell(
            c.system,
            c.method,
            c.seed,
            c.config_hash(),
            numerics(c) if numerics is not None else None,
            key,
            study,
            measure,
        )
        for c, key, study, measure in rows
    )
    known_systems = set(SYSTEM_NAMES) | plugin_systems() | set(base.define_systems)
    return LedgerScope(
        cells,
        tuple(base.seeds),
        frozenset(known_systems | set(base.systems) | {c.system for c in cells}),
        frozenset(_known_methods() | set(base.methods)),
        frozenset(c.study for c in cells if c.study),
    )


def _scope_rows(
    config_file: str | Path | None,
    systems: Sequence[str] | None,
    methods: Sequence[str] | None,
    profile: str,
    studies: StudyCells | None,
) -> list[tuple[CellConfig, str, str, str]]:
    """The scope's cells in its order, each with its ablation or variant key, study and
    measure (:func:`scope_of`)."""
    tagged = ledger_cell_configs(config_file, systems=systems, methods=methods, profile=profile)
    rows: list[tuple[CellConfig, str, str, str]] = [(c, key, "", "") for c, key in tagged]
    if studies is not None and config_file is None:
        bases = _ProfileCells(profile)
        rows += [(c, variant_of(c, bases.of(c)), s, m) for s, m, c in studies.cells(profile)]
    return rows


class _ProfileCells:
    """The profile's own cell of a system, method and seed (what a study's cell is compared
    with), built once per system and method."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self._built: dict[tuple[str, str], dict[int, CellConfig]] = {}

    def of(self, cell: CellConfig) -> CellConfig | None:
        key = (cell.system, cell.method)
        if key not in self._built:
            config = paper_config(
                profile=self.profile, systems=[cell.system], methods=[cell.method]
            )
            self._built[key] = {c.seed: c for c in config.cells()}
        return self._built[key].get(cell.seed)


def _known_methods() -> set[str]:
    """The built-in models and the plugins' (entry-point metadata: no plugin is imported)."""
    from importlib.metadata import entry_points

    return set(METHODS) | {ep.name for ep in entry_points(group="nllab.models")}


def ledger_scope(
    config_file: str | Path | None = None,
    systems: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    *,
    say: Callable[[str], None] | None = None,
    profile: str = "paper",
    studies: StudyCells | None = None,
    ledger: str | Path | None = None,
) -> LedgerScope:
    """:func:`scope_of` (of ``profile``, with the ``studies``' cells if given) with today's
    numerics, read from the installation's cache (else ``$NLLAB_HOME/ledger``) when computed
    before at this code state (standard library only), else computed once (by one process at a
    time: another that asks meanwhile computes the canaries from the scope's other end, then
    waits and reads it) and cached; ``say`` is told when it computes. Selections within the
    profile's own systems and methods share its scope (one cache file;
    :meth:`LedgerScope.select` narrows it).

    ``ledger``: the ledger file whose records it will judge (None: any). Only the cells it
    holds records of need today's numerics (one without is missing whatever they are), so only
    theirs are computed, the others keep None until a record asks: the studies' and the peers'
    canaries, most of a new code state's cost, wait until their cells train. The cache keeps
    what was computed; a later call computes what it lacks."""
    from tasks.config.names import MAIN_SYSTEMS

    if (
        config_file is None
        and set(systems or ()) <= set(MAIN_SYSTEMS)
        and set(methods or ()) <= set(METHODS)
    ):
        systems = methods = None
    key = _code_state(
        None if config_file is None else str(config_file),
        None if systems is None else tuple(systems),
        None if methods is None else tuple(methods),
        profile,
        None if studies is None else tuple(map(str, studies.sources)),
    )
    name = f"scope-{key[:24]}.json" if key else ""
    # nothing in the key is the home's: the installation's folder, then the home's
    folders = cache_folders("ledger") if name else []
    wanted = None if ledger is None else frozenset(r.config_hash for r in read_ledger(ledger))
    if (cached := _cached(folders, name)) is not None and not _lacking(cached, wanted):
        return cached
    if say is not None:
        say(
            "ledger: computing today's config hashes and numerics fingerprints (once per code "
            "state; cached beside the installation)"
        )
    rows = functools.partial(_scope_rows, config_file, systems, methods, profile, studies)
    with _computing_alone(folders, name, functools.partial(_numerics_from_the_end, rows, wanted)):
        # a process that waited for the lock finds what the one before it computed
        if (cached := _cached(folders, name)) is not None and not _lacking(cached, wanted):
            return cached
        numerics = _NumericsOf(wanted, cached)
        scope = scope_of(
            config_file, systems, methods, numerics=numerics, profile=profile, studies=studies
        )
        any(_write(folder / name, scope) for folder in folders)  # the first that takes it
    return scope


class _NumericsOf:
    """Today's numerics of a cell whose config hash is ``wanted`` (None: any), computed once
    per config hash (the cells of one hash are one config), else what ``cached`` (a scope
    computed before) holds of it: None where nothing was computed."""

    def __init__(self, wanted: frozenset[str] | None, cached: LedgerScope | None) -> None:
        self.wanted = wanted
        self.known = {} if cached is None else {c.config_hash: c.numerics for c in cached.cells}

    def __call__(self, cell: CellConfig) -> str | None:
        h = cell.config_hash()
        if self.known.get(h) is None and (self.wanted is None or h in self.wanted):
            self.known[h] = cell_numerics(cell)
        return self.known.get(h)


def _lacking(scope: LedgerScope, wanted: frozenset[str] | None) -> bool:
    """Whether a cell of ``scope`` whose config hash is ``wanted`` (None: any) has no numerics
    computed yet."""
    return any(
        c.numerics is None and (wanted is None or c.config_hash in wanted) for c in scope.cells
    )


def _numerics_from_the_end(
    rows: Callable[[], Sequence[tuple[CellConfig, str, str, str]]],
    wanted: frozenset[str] | None = None,
) -> None:
    """While another process computes a scope, its canaries in the order of its ``rows``
    (:func:`_scope_rows`), compute them from the other end (those of the ``wanted`` config
    hashes; None: all): each is kept in the numerics cache the two share, where the other finds
    it, so that they meet in the middle."""
    try:
        for cell, *_ in reversed(rows()):
            if wanted is None or cell.config_hash() in wanted:
                cell_numerics(cell)
    except Exception:  # (only a help: the holder's own computation says what fails)
        pass


def _cached(folders: Sequence[Path], name: str) -> LedgerScope | None:
    """The scope ``name`` from the first of ``folders`` that holds it."""
    return next((s for f in folders if (s := _read(f / name)) is not None), None)


@contextlib.contextmanager
def _computing_alone(
    folders: Sequence[Path], name: str, while_waiting: Callable[[], object] | None = None
) -> Iterator[None]:
    """One process at a time computes the scope ``name``: an exclusive lock beside it, in the
    first of ``folders`` that can be made and written (two ledger commands started together on
    a new code state would otherwise both spend a minute of canaries on it; the one that waits
    runs ``while_waiting`` first); unlocked where none can."""
    from tasks.machine import exclusive

    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if not os.access(folder, os.W_OK | os.X_OK):
            continue  # (an installation's folder made read-only: the home's holds the lock)
        with exclusive(folder / f"{name}.lock", while_waiting=while_waiting):
            yield
        return
    yield


@functools.cache
def _code_state(
    config_file: str | None,
    systems: tuple[str, ...] | None,
    methods: tuple[str, ...] | None,
    profile: str = "paper",
    study_sources: tuple[str, ...] | None = None,
) -> str | None:
    """The cache key of a scope (None: not cacheable: a config file that declares systems).

    Once per process: loading the models sets the portable CPU mode's variables
    (:mod:`nlmodels.numerics`), which are part of the key, so a key taken after that would
    differ from the one the same process took before."""
    # the paper profile's key as it was before there were two (its cached scopes stay valid)
    named = "" if profile == "paper" else f"; {profile}"
    h = hashlib.sha256(f"{_FORMAT}; {sys.version}; {systems}; {methods}{named}".encode())
    if config_file is not None:
        text = Path(config_file).read_bytes()
        if b"define_systems" in text:
            return None
        h.update(text)
    for package in _PACKAGES:
        _hash_tree(_ROOT / package, h)
    for source in study_sources or ():
        h.update(b"studies")
        path = Path(source)
        if path.is_dir():
            _hash_tree(path, h)
        elif path.is_file():
            h.update(str(path.relative_to(_ROOT)).encode())
            h.update(path.read_bytes())
    for module in ("torch", "numpy"):  # their builds: version files, not imported
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin is not None:
            version = Path(spec.origin).parent / "version.py"
            h.update(version.read_bytes() if version.is_file() else spec.origin.encode())
    h.update(numerics_environment().encode())
    _hash_plugins(h)
    return h.hexdigest()


def _hash_tree(folder: Path, h: Any) -> None:
    if not folder.is_dir():
        return
    for p in sorted(folder.rglob("*")):
        if p.suffix in _SUFFIXES and p.is_file():
            h.update(str(p.relative_to(_ROOT)).encode())
            h.update(p.read_bytes())


def _hash_plugins(h: Any) -> None:
    """Installed model and system plugins: names, targets and their top-level sources."""
    from importlib.metadata import entry_points

    for group in ("nllab.models", "nllab.systems"):
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            h.update(f"{group}:{ep.name}={ep.value}".encode())
            top = ep.value.split(":", 1)[0].split(".", 1)[0]
            spec = importlib.util.find_spec(top)
            if spec is not None and spec.origin is not None:
                origin = Path(spec.origin)
                if spec.submodule_search_locations:
                    _hash_tree(origin.parent, h)
                elif origin.is_file():
                    h.update(origin.read_bytes())


def _read(path: Path) -> LedgerScope | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return LedgerScope(
            tuple(LedgerCell(*c) for c in data["cells"]),
            tuple(data["seeds"]),
            frozenset(data["systems"]),
            frozenset(data["methods"]),
            frozenset(data["studies"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, scope: LedgerScope) -> bool:
    """Atomically; whether it was written (a folder that cannot be written only costs the next
    call the computation)."""
    data = {
        "cells": [
            [
                c.system,
                c.method,
                c.seed,
                c.config_hash,
                c.numerics,
                c.ablation,
                c.study,
                c.measure,
            ]
            for c in scope.cells
        ],
        "seeds": list(scope.seeds),
        "systems": sorted(scope.systems),
        "methods": sorted(scope.methods),
        "studies": sorted(scope.studies),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as f:
            json.dump(data, f)
        os.replace(f.name, path)
    except OSError:
        return False
    return True
