"""Typed run configuration: defaults ← profile ← config file ← command-line flags.

A :class:`RunConfig` describes a whole benchmark (systems × methods × seeds);
:meth:`RunConfig.cells` expands it into :class:`CellConfig` objects, one per training run. A cell's
:meth:`~CellConfig.config_hash` covers everything that changes its result (and nothing that does
not, such as the device or the profile name), so a finished cell can be recognised and skipped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nltrain import TrainConfig
from tasks.config._files import (
    ConfigError,
    deep_merge,
    lift_execution,
    load_config_file,
    profile_file,
    profile_layer,
)
from tasks.config.checks import (
    ModelOptionError,
    check_model_overrides,
    format_validation,
    option_problems,
    validation_problems,
)
from tasks.config.declarations import (
    SystemDeclaration,
    SystemSource,
    declare_plugin_systems,
    declare_systems,
    declared_data,
    declared_sources,
)
from tasks.config.names import (
    BUILTIN_METHODS,
    MAIN_SYSTEMS,
    METHODS,
    PAPER_METHODS,
    SYSTEM_NAMES,
    check_known,
    known_methods,
    known_systems,
    quick_epochs_for,
    tell_once,
)
from tasks.config.run_settings import (
    DEVICES,
    EXECUTION_KEYS,
    Device,
    ExecutionConfig,
    Frozen,
    Reuse,
    TrackingConfig,
)
from tasks.config.user_modules import find_user_modules

if TYPE_CHECKING:  # served by __getattr__ below, on first use
    #: Epochs each model trains in the ``quick`` profile (its file's ``method_epochs``).
    QUICK_EPOCHS: dict[str, int]

__all__ = [
    "BUILTIN_METHODS",
    "DEVICES",
    "MAIN_SYSTEMS",
    "MAX_SEED",
    "METHODS",
    "PAPER_BUDGET_PROFILES",
    "PAPER_METHODS",
    "PROFILES",
    "QUICK_EPOCHS",
    "SYSTEM_NAMES",
    "CellConfig",
    "ConfigError",
    "DataConfig",
    "Device",
    "ExecutionConfig",
    "ModelOptionError",
    "Profile",
    "Reuse",
    "RunConfig",
    "TrackingConfig",
    "TrainConfig",
    "declare_systems",
    "known_methods",
    "known_systems",
    "load_config_file",
    "non_default_overrides",
    "profile_file",
    "resolve_config",
    "validation_problems",
]

#: Size presets of a run, each a config file the package ships (``tasks/profiles/<name>.yaml``).
Profile = Literal["smoke", "quick", "paper", "fair"]
PROFILES: tuple[str, ...] = get_args(Profile)
#: The profiles that train the paper's budget (5 seeds x 1000 epochs, N = 1000): ``paper`` as
#: the reference code runs it, ``fair`` with every baseline on Neural Laplace's terms. Only their
#: tables are judged against the paper's figures.
PAPER_BUDGET_PROFILES: tuple[str, ...] = ("paper", "fair")

#: The fewest trajectories a split may hold for its models to be registered: the smoke profile's
#: 40 trajectories split 32/4/4, the smallest split a shipped profile makes; with fewer, one
#: unusual trajectory decides a test RMSE and so which model becomes a champion.
MIN_SPLIT = 4
#: The largest seed: NumPy's and the data simulators' generators take 32-bit seeds.
MAX_SEED = 2**32 - 1


#: Bumped when the meaning of a cell's fields changes, so old hashes stop matching.
_HASH_SCHEMA = 1

#: A model override value: a number, flag, name, or a sequence of layer widths.
Scalar = bool | int | float | str | tuple[int, ...]


#: The quick profile's epochs are read from its file on first use: importing ``tasks.config``
#: reads no profile file.
def __getattr__(name: str) -> Any:
    if name == "QUICK_EPOCHS":
        return dict(profile_layer("quick")["method_epochs"])
    raise AttributeError(f"module 'tasks.config' has no attribute {name!r}")


def non_default_overrides(method: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`nlmodels.model_registry.non_default_overrides`, importing the models (torch) on
    first call rather than with this module."""
    from nlmodels.model_registry import non_default_overrides as of_registry

    return of_registry(method, overrides)


class DataConfig(Frozen):
    """How each cell's data set is simulated and split (see ``datasets.load_or_simulate``)."""

    n_trajectories: int | None = Field(None, ge=10, description="None: the system's default")
    n_points: int | None = Field(None, ge=4, description="None: the system's default (200)")
    noise_std: float = Field(0.0, ge=0.0)
    noise_on: Literal["raw", "normalised"] = Field(
        "raw",
        description="where the noise_std noise is added: to the simulated values in physical "
        "units, before the z-score ('raw'), or after it, in normalised units with the noise-free "
        "data's statistics, as the paper's reference code does ('normalised'); no effect "
        "without noise",
    )
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    n_observed: int | None = Field(None, ge=1, description="None: the first half")
    n_train: int | None = Field(None, ge=1, description="None: all training trajectories")
    normalise_on: Literal["train", "all"] = Field(
        "train",
        description="z-score statistics from the training split, or from every trajectory "
        "before the split (std with ddof=1) as the paper's reference code does",
    )
    source: SystemSource | None = Field(None, description="a declared system's file/simulator")

    @property
    def noise_effective(self) -> bool:
        """Whether ``noise_on`` sets this data apart: noise added after the z-score (where
        there is none, where it would go is nothing)."""
        return self.noise_on != "raw" and self.noise_std > 0.0

    @field_validator("fractions")
    @classmethod
    def _fractions_sum_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(f <= 0 for f in v) or abs(sum(v) - 1.0) > 1e-9:
            raise ValueError(f"train/val/test fractions must be positive and sum to 1, got {v}")
        return v


class CellConfig(Frozen):
    """One training run: a method on a system with a seed. Its hash identifies its result."""

    system: str
    method: str
    seed: int = Field(ge=0, le=MAX_SEED)
    data: DataConfig = DataConfig()
    training: TrainConfig = TrainConfig()
    model: dict[str, Scalar] = Field(default_factory=dict, description="build_model overrides")

    @model_validator(mode="after")
    def _valid_model(self) -> CellConfig:
        check_model_overrides(self.method, self.model)
        return self

    @property
    def key(self) -> str:
        return f"{self.system}/{self.method}/seed{self.seed}"

    def canonical_json(self) -> str:
        """What the hash covers: every field, with model overrides equal to the model's own
        default left out (``stereographic = true`` is the default model, the same cell)."""
        payload = {"schema": _HASH_SCHEMA, **self._dump()}
        if self.data.source is not None:  # the file's content, not where it lies
            payload["data"]["source"] = self.data.source.hashed()
        payload["model"] = non_default_overrides(self.method, payload["model"])
        if payload["data"]["normalise_on"] == "train":
            # the default before the setting existed: finished cells keep their hashes
            del payload["data"]["normalise_on"]
        return json.dumps(payload, sort_keys=True, separators=(",", ":"))

    def _dump(self) -> dict[str, Any]:
        dump = self.model_dump(mode="json")
        if dump["data"]["source"] is None:  # a built-in system: hashes and params as before
            del dump["data"]["source"]
        if not self.data.noise_effective:  # raw noise, or none: hashes and params as before
            del dump["data"]["noise_on"]
        return dump

    def config_hash(self) -> str:
        """sha256 of the canonical JSON of everything that determines this cell's result."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def flat_params(self) -> dict[str, str]:
        """The cell as flat ``section.key -> value`` strings, for MLflow params."""
        out: dict[str, str] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, Mapping):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            else:
                out[prefix] = json.dumps(value) if isinstance(value, list | tuple) else str(value)

        walk("", self._dump())
        return out


class CellOverride(Frozen):
    """Model and training settings for one (system, method) pair, e.g. a tuned configuration."""

    model: dict[str, Scalar] = Field(default_factory=dict)
    training: dict[str, Scalar | None] = Field(default_factory=dict)


class RunConfig(Frozen):
    """A whole benchmark: the experiment (every system × method × seed, data, training, models,
    tracking) and, apart from it, how it executes (:attr:`execution`)."""

    profile: Profile = "quick"
    define_systems: dict[str, SystemDeclaration] = Field(default_factory=dict)  # by name
    systems: tuple[str, ...] = MAIN_SYSTEMS
    methods: tuple[str, ...] = METHODS
    seeds: tuple[int, ...] = (0,)
    data: DataConfig = DataConfig()
    training: TrainConfig = TrainConfig()
    models: dict[str, dict[str, Scalar]] = Field(
        default_factory=dict, description="per-method build_model overrides"
    )
    cell_overrides: dict[str, CellOverride] = Field(
        default_factory=dict,
        description="per 'system/method' model and training overrides (nllab benchmark --tuned); "
        "explicit per-method `models` overrides win over them",
    )
    method_epochs: dict[str, int] = Field(
        default_factory=dict,
        description="epochs per method, over training.epochs (the quick profile's equal "
        "training time); an epoch count set in a config file or on the command line replaces "
        "a profile's",
    )
    tracking: TrackingConfig = TrackingConfig()
    execution: ExecutionConfig = ExecutionConfig()
    _sources: dict[str, SystemSource] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _gather_execution(cls, data: Any) -> Any:
        data = declare_plugin_systems(data)  # an installed simulator named in systems
        if isinstance(data, Mapping) and any(k in data for k in EXECUTION_KEYS):
            data = dict(data)
            moved = {k: data.pop(k) for k in EXECUTION_KEYS if k in data}
            data["execution"] = {**dict(data.get("execution") or {}), **moved}
        return data

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        """A run config recorded as JSON (a benchmark's ``run_config.json``), its declared
        systems declared first (:func:`declare_systems`), as :func:`resolve_config` does."""
        raw = json.loads(text)
        return cls.model_validate(raw, context={"declared": declare_systems(raw)})

    def experiment_json(self) -> str:
        """The experiment alone (no execution settings), as indented JSON."""
        return self.model_dump_json(indent=2, exclude={"execution"})

    @field_validator("systems")
    @classmethod
    def _valid_systems(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        declared = tuple(info.data.get("define_systems") or ())
        return check_known("system", v, SYSTEM_NAMES, declared)

    @field_validator("methods")
    @classmethod
    def _valid_methods(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return check_known("method", v, BUILTIN_METHODS)

    @field_validator("models", mode="before")
    @classmethod
    def _valid_model_keys(cls, v: Any) -> Any:
        # Before pydantic's own coercion, so that each bad option is one line naming it (and a
        # value of the wrong type is reported as such, not as one error per type it is not).
        if not isinstance(v, Mapping) or not all(isinstance(o, Mapping) for o in v.values()):
            return v  # pydantic names what is wrong with the shape
        known = check_known("method", tuple(v), BUILTIN_METHODS) if v else ()
        problems = [
            p
            for method, overrides in v.items()
            if method in known
            for p in option_problems(method, overrides)
        ]
        if problems:
            raise ModelOptionError(problems)
        return v

    @field_validator("method_epochs")
    @classmethod
    def _valid_method_epochs(cls, v: dict[str, int]) -> dict[str, int]:
        check_known("method", tuple(v), BUILTIN_METHODS) if v else None
        bad = {m: n for m, n in v.items() if n < 1}
        if bad:
            raise ValueError(f"epochs must be at least 1, got {bad}")
        return v

    @field_validator("seeds")
    @classmethod
    def _valid_seeds(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(not 0 <= s <= MAX_SEED for s in v) or len(set(v)) != len(v):
            raise ValueError(
                f"seeds must be distinct non-negative integers up to {MAX_SEED}, got {list(v)}"
            )
        return v

    @model_validator(mode="after")
    def _data_fits(self, info: ValidationInfo) -> RunConfig:
        """Fail before simulating when a data set cannot fit in memory (with the estimate) or
        leaves a split empty. Declared systems are read as :func:`declare_systems` declared
        them (passed in the validation context as ``declared``, else this process's)."""
        from datasets import check_memory

        given = (info.context or {}).get("declared")
        self._sources = declared_sources(self.define_systems, self.systems, given)
        for system in self.systems:
            data = self.data_for(system)
            check_memory(system, data.n_trajectories, data.n_points)
            try:
                self.split_sizes(system)
            except ValueError as e:
                raise ValueError(f"{system}: {e}") from None
        return self

    def split_sizes(self, system: str) -> tuple[int, int, int]:
        """Trajectories in ``system``'s train (after the ``n_train`` sub-sample), validation
        and test splits, checked as :func:`datasets.prepare` checks them (``ValueError`` naming
        an empty training split, an ``n_train`` over it or an ``n_observed`` over half the
        points)."""
        from datasets import SYSTEMS, check_split

        data, info = self.data_for(system), SYSTEMS[system]
        return check_split(
            data.n_trajectories or info.default_trajectories,
            data.n_points or info.default_points,
            data.fractions,
            data.n_observed,
            data.n_train,
        )

    def small_split(self, system: str) -> str | None:
        """Why the models of ``system`` are never registered: a split of fewer than
        :data:`MIN_SPLIT` trajectories (their scores rest on too few); else ``None``."""
        sizes = self.split_sizes(system)
        if min(sizes) >= MIN_SPLIT:
            return None
        return (
            f"{system}: its data split {'/'.join(map(str, sizes))} trajectories (train/validation"
            f"/test), fewer than {MIN_SPLIT} in a split; its models train but are never registered"
        )

    def data_for(self, system: str) -> DataConfig:
        """The data settings of ``system``'s cells (a declared system's carry its source)."""
        return declared_data(self.data, system, self._sources, self.define_systems)

    def cells(self) -> list[CellConfig]:
        """Cells in a stable order: system, then method, then seed."""
        cells = []
        for system in self.systems:
            for method in self.methods:
                model, training = dict(self.models.get(method, {})), self.training
                if method in self.method_epochs:
                    training = training.model_copy(update={"epochs": self.method_epochs[method]})
                tuned = self.cell_overrides.get(f"{system}/{method}")
                if tuned is not None:
                    model = {**tuned.model, **model}
                    training = TrainConfig.model_validate(
                        {**training.model_dump(), **tuned.training}
                    )
                cells += [
                    CellConfig(
                        system=system,
                        method=method,
                        seed=seed,
                        data=self.data_for(system),
                        training=training,
                        model=model,
                    )
                    for seed in self.seeds
                ]
        return cells


def resolve_config(
    profile: str | None = None,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Resolve defaults ← profile ← config file ← ``overrides`` (command-line flags).

    The profile is chosen by ``profile`` if given, else by the file's ``profile`` key, else
    ``quick``. Raises :class:`ConfigError` with every problem listed.
    """
    file_layer = load_config_file(config_file) if config_file is not None else {}
    cli_layer = {k: v for k, v in (overrides or {}).items() if v is not None}
    name = profile or cli_layer.get("profile") or file_layer.get("profile") or "quick"
    if name not in PROFILES:
        raise ConfigError(f"unknown profile {name!r}; valid profiles: {', '.join(PROFILES)}")
    layers = [
        lift_execution(x, EXECUTION_KEYS) for x in (profile_layer(name), file_layer, cli_layer)
    ]
    if any("epochs" in dict(x.get("training") or {}) for x in layers[1:]):
        # epochs asked for explicitly apply to every method, unless per-method ones are too
        layers[0].pop("method_epochs", None)
    merged = deep_merge(deep_merge(layers[0], layers[1]), layers[2])
    merged["profile"] = name
    if name in PAPER_BUDGET_PROFILES and not merged.get("methods"):
        # the paper's budget trains the paper's Table 3 unless models are named: the main
        # table's other rows are run at it by name (the ledger's Laplace-domain peers)
        merged["methods"] = list(PAPER_METHODS)
    try:
        find_user_modules(merged, config_file)  # module:Class and module:function names
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if name == "quick" and "method_epochs" in layers[0]:  # the profile sizes each model
        quick_epochs_for(merged.get("methods") or METHODS, merged["method_epochs"])
    try:
        merged = declare_plugin_systems(merged)  # an installed simulator named in systems
        declared = declare_systems(merged)  # each file and simulator checked, then declared
        config = RunConfig.model_validate(merged, context={"declared": declared})
    except ValidationError as e:
        raise ConfigError(format_validation(e)) from None
    except ValueError as e:  # a data file's or a simulator's problem, in one line
        raise ConfigError(str(e)) from None
    for system in config.systems:
        if (problem := config.small_split(system)) is not None:
            tell_once(f"nllab: {problem}")
    return config
