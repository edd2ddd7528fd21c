"""The valid system and method names: the built-in ones and those a user adds (systems declared
in a config file, models from plugins), and the quick profile's stated epoch count for a model
it does not size.

One list of valid method names, the model registry with its plugins
(:func:`nlmodels.model_registry.model_names`); ``tasks.config.METHODS`` is only the main
table's default set. The built-in models, the main table's rows, their labels and their quick
epochs are derived from one registration, ``nlmodels/models.toml``, read here without importing
torch (the command line checks names before the numerical stack loads).
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from types import MappingProxyType

__all__ = [
    "BUILTIN_METHODS",
    "DEFAULT_QUICK_EPOCHS",
    "MAIN_SYSTEMS",
    "METHODS",
    "MODEL_CARDS",
    "PAPER_METHODS",
    "SYSTEM_NAMES",
    "ModelCard",
    "check_known",
    "known_methods",
    "known_systems",
    "model_label",
    "plugin_systems",
    "quick_epochs_for",
    "read_model_cards",
    "tell_once",
]


@dataclass(frozen=True)
class ModelCard:
    """A built-in model's registration (one table of ``nlmodels/models.toml``)."""

    name: str
    module: str  # imported by ``import nlmodels``; it registers the class under ``name``
    label: str  # its short name in rankings
    main_table: bool = False  # a row of the main table (and of a plain ``nllab benchmark``)
    paper_table: bool = False  # a row of the paper's Table 3 (the ledger's Table 3, the studies)
    quick_epochs: int | None = None  # quick-profile epochs where quick.yaml does not list it


def read_model_cards(path: Path) -> dict[str, ModelCard]:
    """The model cards of a catalog file; ``ValueError`` naming the file, model and key."""
    cards = {}
    for name, entry in tomllib.loads(path.read_text(encoding="utf-8")).items():
        unknown = sorted(
            set(entry) - {"module", "label", "main_table", "paper_table", "quick_epochs"}
        )
        epochs = entry.get("quick_epochs")
        if unknown or not isinstance(entry.get("module"), str):
            raise ValueError(f"{path}: [{name}]: a module, and no key {unknown or ''}")
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise ValueError(f"{path}: [{name}] quick_epochs: a positive integer, got {epochs!r}")
        label = entry.get("label", name)
        cards[name] = ModelCard(
            name,
            entry["module"],
            label,
            bool(entry.get("main_table")),
            bool(entry.get("paper_table")),
            epochs,
        )
    return cards


def _catalog() -> Path:
    """``nlmodels/models.toml``, found without importing ``nlmodels`` (which loads torch)."""
    spec = find_spec("nlmodels")
    assert spec is not None and spec.submodule_search_locations, "nlmodels is not importable"
    return Path(next(iter(spec.submodule_search_locations))) / "models.toml"


#: The built-in models by name, in the catalog's order: ``nlmodels/models.toml``.
MODEL_CARDS: Mapping[str, ModelCard] = MappingProxyType(read_model_cards(_catalog()))
#: Every built-in model (plugins aside).
BUILTIN_METHODS: tuple[str, ...] = tuple(MODEL_CARDS)

#: Systems of the paper's main table (Table 3), in its column order.
MAIN_SYSTEMS: tuple[str, ...] = (
    "spiral_dde",
    "lotka_volterra_dde",
    "mackey_glass_dde",
    "stiff_van_der_pol",
    "piecewise_forcing_ode",
    "integro_de",
)
#: Methods of the main table, in its row order: the catalog's ``main_table`` models.
METHODS: tuple[str, ...] = tuple(n for n, card in MODEL_CARDS.items() if card.main_table)
#: Methods of the paper's Table 3 (Holt et al., 2022), in its row order: the catalog's
#: ``paper_table`` models; the main table's others are models the paper does not run.
PAPER_METHODS: tuple[str, ...] = tuple(n for n, c in MODEL_CARDS.items() if c.paper_table)
#: Every system ``datasets.SYSTEMS`` simulates, known without importing numpy: the command line
#: checks names before the numerical stack loads (a test keeps it equal to the registry).
SYSTEM_NAMES: tuple[str, ...] = (
    "integro_de",
    "lotka_volterra_dde",
    "mackey_glass_dde",
    "noisy_sines",
    "piecewise_forcing_ode",
    "sawtooth",
    "sine",
    "spiral_dde",
    "square",
    "stiff_van_der_pol",
)
#: Epochs of a model that the quick profile's ``method_epochs`` does not list (a plugin's).
DEFAULT_QUICK_EPOCHS = 100

_TOLD: set[str] = set()


def known_systems() -> tuple[str, ...]:
    from datasets import SYSTEMS

    return tuple(sorted(SYSTEMS))


def check_known(
    kind: str, names: tuple[str, ...], builtin: tuple[str, ...], declared: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """``names`` checked against the valid ``kind`` names (a :class:`ValueError` naming them
    otherwise). Names the package ships (``builtin``) pass without loading the registries
    (numpy, torch), so a configuration of built-in names validates on pydantic alone; any
    other is looked up among the installed plugins (their metadata, :mod:`tasks.config.plugins`: a
    name two packages claim is refused naming both) and the registry (systems: and those
    ``declared``)."""
    from tasks.config.checks import check_names
    from tasks.config.mlflow_names import name_problem
    from tasks.config.plugins import MODEL_GROUP, SYSTEM_GROUP, plugin_table

    table = plugin_table(SYSTEM_GROUP if kind == "system" else MODEL_GROUP, builtin)
    for name in names:
        if not isinstance(name, str):
            continue
        used = name in builtin or name in declared  # a built-in or declared name wins
        problem = name_problem(kind, name) or (None if used else table.problem(name))
        if problem is not None:
            raise ValueError(problem)
    if names and set(names) <= set(builtin):
        return check_names(kind, names, builtin)
    valid = known_systems() + declared if kind == "system" else known_methods(names)
    return check_names(kind, names, valid)


def plugin_systems() -> frozenset[str]:
    """The simulators installed as entry points of ``nllab.systems`` that may be used by name
    (:mod:`tasks.config.plugins`), read from their metadata."""
    from tasks.config.plugins import SYSTEM_GROUP, plugin_table

    return frozenset(plugin_table(SYSTEM_GROUP, SYSTEM_NAMES).usable)


def known_methods(wanted: Iterable[str] = ()) -> tuple[str, ...]:
    """The methods a run may name: the built-in ones, the installed plugins' (from their
    metadata: none is imported), and those of ``wanted`` spelled ``module:Class`` (imported
    here; ``ValueError`` when one cannot be). A name none of these knows is looked up in the
    registry of this process (a class registered by code of the user's)."""
    from tasks.config.plugins import MODEL_GROUP, plugin_table

    valid = set(BUILTIN_METHODS) | set(plugin_table(MODEL_GROUP, BUILTIN_METHODS).usable)
    wanted = [n for n in wanted if isinstance(n, str)]
    for name in wanted:
        if ":" in name:
            from nlmodels.model_registry import find_model

            find_model(name)
            valid.add(name)
    if set(wanted) - valid:
        from nlmodels.model_registry import model_names

        valid.update(model_names())
    return tuple(sorted(valid))


def tell_once(line: str) -> None:
    """Print ``line`` on stderr, once per process (a config resolved again says it once)."""
    if line not in _TOLD:
        _TOLD.add(line)
        print(line, file=sys.stderr)


def model_label(method: str) -> str:
    """``method``'s short name in rankings: its catalog label, else the name itself."""
    card = MODEL_CARDS.get(method)
    return card.label if card is not None else method


def quick_epochs_for(methods: Iterable[str], method_epochs: MutableMapping[str, int]) -> None:
    """Give each of ``methods`` that the quick profile does not size the epochs its catalog
    entry states, else :data:`DEFAULT_QUICK_EPOCHS`, saying so once per method and process."""
    for method in methods:
        if not isinstance(method, str) or method in method_epochs:
            continue
        card = MODEL_CARDS.get(method)
        if card is not None and card.quick_epochs is not None:
            method_epochs[method] = card.quick_epochs  # stated by its registration
            continue
        method_epochs[method] = DEFAULT_QUICK_EPOCHS
        tell_once(
            f"nllab: {method!r} has no epoch count in the quick profile; it trains "
            f"{DEFAULT_QUICK_EPOCHS} epochs (set method_epochs.{method} to change)"
        )
