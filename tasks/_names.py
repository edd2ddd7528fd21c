"""The valid system and method names: the built-in ones and those a user adds (systems declared
in a config file, models from plugins), and the quick profile's stated epoch count for a model
it does not size.

One list of valid method names, the model registry with its plugins
(:func:`nlmodels.model_registry.model_names`); ``tasks.config.METHODS`` is only the main
table's default set.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, MutableMapping

__all__ = [
    "DEFAULT_QUICK_EPOCHS",
    "MAIN_SYSTEMS",
    "METHODS",
    "SYSTEM_NAMES",
    "check_known",
    "known_methods",
    "known_systems",
    "plugin_systems",
    "quick_epochs_for",
    "tell_once",
]

#: Systems of the paper's main table (Table 3), in its column order.
MAIN_SYSTEMS: tuple[str, ...] = (
    "spiral_dde",
    "lotka_volterra_dde",
    "mackey_glass_dde",
    "stiff_van_der_pol",
    "piecewise_forcing_ode",
    "integro_de",
)
#: Methods of the main table, in its row order.
METHODS: tuple[str, ...] = (
    "node",
    "anode",
    "latent_ode",
    "nf_coupling",
    "nf_resnet",
    "neural_laplace",
)
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
    other is looked up among the installed plugins (their metadata, :mod:`tasks.plugins`: a
    name two packages claim is refused naming both) and the registry (systems: and those
    ``declared``)."""
    from tasks._config_checks import check_names
    from tasks.plugins import MODEL_GROUP, SYSTEM_GROUP, plugin_table
    from tasks.tracking.mlflow_names import name_problem

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
    (:mod:`tasks.plugins`), read from their metadata."""
    from tasks.plugins import SYSTEM_GROUP, plugin_table

    return frozenset(plugin_table(SYSTEM_GROUP, SYSTEM_NAMES).usable)


def known_methods(wanted: Iterable[str] = ()) -> tuple[str, ...]:
    """The methods a run may name: the built-in ones, the installed plugins' (from their
    metadata: none is imported), and those of ``wanted`` spelled ``module:Class`` (imported
    here; ``ValueError`` when one cannot be). A name none of these knows is looked up in the
    registry of this process (a class registered by code of the user's)."""
    from tasks.plugins import MODEL_GROUP, plugin_table

    valid = set(METHODS) | set(plugin_table(MODEL_GROUP, METHODS).usable)
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


def quick_epochs_for(methods: Iterable[str], method_epochs: MutableMapping[str, int]) -> None:
    """Give each of ``methods`` that the quick profile does not size
    :data:`DEFAULT_QUICK_EPOCHS`, saying so once per method and process."""
    for method in methods:
        if not isinstance(method, str) or method in method_epochs:
            continue
        method_epochs[method] = DEFAULT_QUICK_EPOCHS
        tell_once(
            f"nllab: {method!r} has no epoch count in the quick profile; it trains "
            f"{DEFAULT_QUICK_EPOCHS} epochs (set method_epochs.{method} to change)"
        )
