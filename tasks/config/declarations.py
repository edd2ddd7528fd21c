"""Systems declared in a config file (``[define_systems.NAME]``): from a data file or a
simulator of the user's, resolved into the :class:`SystemSource` each of their cells carries.

A cell's source holds what its data depend on (the file's content digest and columns, or the
simulator's name, options and source fingerprint) and where to find them again (the file's
path, which the config hash leaves out: the same bytes elsewhere are the same cells). Any
process that handles the cell declares the system from it on first use (:func:`ensure_declared`),
so worker processes, tuning and ``nllab reproduce`` need nothing but the cell.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "SystemDeclaration",
    "SystemSource",
    "declare_plugin_systems",
    "declare_systems",
    "declared_data",
    "declared_names",
    "declared_sources",
    "ensure_declared",
    "resolve_sources",
    "system_info",
]

Option = bool | int | float | str | tuple[int, ...] | tuple[float, ...]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class SystemDeclaration(_Strict):
    """One ``[define_systems.NAME]`` table: a data file or a simulator, and how to read it."""

    file: str | None = Field(None, description=".csv, .parquet (long form) or .npz (t, x)")
    simulator: str | None = Field(
        None, description="'package.module:function' or an entry point of 'nllab.systems'"
    )
    trajectory: str = Field("trajectory", description="long form: the trajectory column")
    time: str = Field("t", description="long form: the time column")
    state: tuple[str, ...] | None = Field(
        None, description="long form: the state columns (None: every other column)"
    )
    n_observed: int | None = Field(
        None, ge=1, description="observed points per trajectory (None: the first half)"
    )
    options: dict[str, Option] = Field(
        default_factory=dict, description="keyword arguments of the simulator"
    )

    @model_validator(mode="after")
    def _one_origin(self) -> SystemDeclaration:
        if (self.file is None) == (self.simulator is None):
            raise ValueError(
                "declare either file = '...' or simulator = '...', not both or neither"
            )
        if self.simulator is not None and self.state is not None:
            raise ValueError("state columns belong to a data file, not to a simulator")
        return self


class SystemSource(_Strict):
    """What a declared system's cell carries: enough to declare the system again anywhere."""

    kind: Literal["file", "simulator"]
    digest: str = Field(description="sha256 of the file's bytes / of the simulator's source")
    path: str | None = Field(None, description="where the file was read (not hashed)")
    trajectory: str = "trajectory"
    time: str = "t"
    state: tuple[str, ...] | None = None
    simulator: str | None = None
    options: dict[str, Option] = Field(default_factory=dict)

    def hashed(self) -> dict[str, Any]:
        """The source as a cell's hash covers it: all but the file's location."""
        return self.model_dump(mode="json", exclude={"path"})


_LOCK = threading.Lock()
_DECLARED: dict[str, SystemSource] = {}  # system -> its source, declared in this process


def _declare(name: str, source: SystemSource, n_observed: int | None = None) -> None:
    import datasets

    if source.kind == "file":
        assert source.path is not None
        datasets.declare_file(
            name,
            source.path,
            trajectory=source.trajectory,
            time=source.time,
            state=source.state,
            n_observed=n_observed,
            digest=source.digest,
        )
    else:
        assert source.simulator is not None
        if datasets.simulator_fingerprint(source.simulator, source.options) != source.digest:
            raise ValueError(
                f"simulator {source.simulator!r} changed since its cells were configured"
            )
        datasets.declare_simulator(name, source.simulator, source.options, n_observed=n_observed)


def ensure_declared(name: str, source: SystemSource | None) -> None:
    """Declare ``name`` in this process from its cell's ``source`` (once per digest)."""
    if source is None:
        return
    with _LOCK:
        known = _DECLARED.get(name)
        if known is None or known.digest != source.digest:
            _declare(name, source)
            _DECLARED[name] = source


def system_info(system: str, data: Any) -> Any:
    """``datasets.SYSTEMS[system]``, declaring it first from ``data.source`` (a cell's data)."""
    from datasets import SYSTEMS

    ensure_declared(system, data.source)
    return SYSTEMS[system]


def declare_plugin_systems(data: Any) -> Any:
    """A run config's raw ``data`` in which each system named in ``systems`` that is an entry
    point of ``nllab.systems`` (and neither built in nor declared) is declared as that
    simulator with its default options."""
    if not isinstance(data, Mapping) or not isinstance(data.get("systems"), list | tuple):
        return data
    from tasks.config.names import known_systems, plugin_systems

    declared = dict(data.get("define_systems") or {})
    plugins = plugin_systems()
    added = {
        n: {"simulator": n}
        for n in data["systems"]
        if n in plugins and n not in declared and n not in known_systems()
    }
    return {**data, "define_systems": {**declared, **added}} if added else data


def resolve_sources(
    declarations: Mapping[str, SystemDeclaration],
    systems: tuple[str, ...],
    n_observed: int | None,
) -> dict[str, SystemSource]:
    """Check each declared system that ``systems`` uses (the whole file, before anything is
    written) and declare it in this process; its source, by name."""
    import datasets

    out: dict[str, SystemSource] = {}
    for name in systems:
        if name not in declarations:
            continue
        d = declarations[name]
        datasets.check_system_name(name)
        observed = n_observed or d.n_observed
        if d.file is not None:
            given, path = Path(d.file).expanduser().absolute(), Path(d.file).expanduser().resolve()
            # every check of the file, each with its one-line message (naming it as the user
            # did, a symlink too), before anything is written
            datasets.declare_file(
                name,
                given,
                trajectory=d.trajectory,
                time=d.time,
                state=d.state,
                n_observed=observed,
            )
            source = SystemSource(
                kind="file",
                digest=datasets.file_digest(path),
                path=str(path),
                trajectory=d.trajectory,
                time=d.time,
                state=d.state,
            )
        else:
            assert d.simulator is not None
            _declare_simulator(name, d.simulator, d.options, observed)
            source = SystemSource(
                kind="simulator",
                digest=datasets.simulator_fingerprint(d.simulator, d.options),
                simulator=d.simulator,
                options=d.options,
            )
        with _LOCK:
            _DECLARED[name] = source
        out[name] = source
    return out


def _declare_simulator(
    name: str, simulator: str, options: Mapping[str, Any], observed: int | None
) -> None:
    """``datasets.declare_simulator``; a simulator that leaves by ``sys.exit`` as it is tried
    is user code failing (exit code 1, as when it simulates), not a setting to change."""
    import datasets
    from tasks.stopping import UserCodeExit

    try:
        datasets.declare_simulator(name, simulator, options, n_observed=observed)
    except ValueError as e:
        if isinstance(e.__cause__, SystemExit):
            raise UserCodeExit(str(e)) from e
        raise


class _Definitions(_Strict):
    define_systems: dict[str, SystemDeclaration] = Field(default_factory=dict)


def declare_systems(raw: Any, names: tuple[str, ...] | None = None) -> dict[str, SystemSource]:
    """Declare in this process the systems that a raw run config (a mapping, before validation)
    defines under ``define_systems`` and uses in ``systems`` (or those of ``names``): each file
    or simulator is checked whole, then added to ``datasets.SYSTEMS``. The explicit step before
    a run config is validated (:func:`tasks.config.resolve_config` takes it; a config's
    validation reads what it declared and declares nothing). Their sources, by name; raises
    pydantic's ``ValidationError`` for a malformed definition and ``ValueError`` (a data
    file's or simulator's one-line problem) for a bad file or simulator."""
    if not isinstance(raw, Mapping) or not raw.get("define_systems"):
        return {}
    defs = _Definitions.model_validate({"define_systems": raw["define_systems"]}).define_systems
    if names is None:
        used = raw.get("systems")
        used = used if isinstance(used, list | tuple) else ()
        names = tuple(n for n in used if isinstance(n, str))
    data = raw.get("data")
    observed = data.get("n_observed") if isinstance(data, Mapping) else None
    if isinstance(observed, bool) or not isinstance(observed, int) or observed < 1:
        observed = None  # the run config's validation names a bad value
    return resolve_sources(defs, names, observed)


def declared_sources(
    declarations: Mapping[str, SystemDeclaration],
    systems: tuple[str, ...],
    given: Mapping[str, SystemSource] | None,
) -> dict[str, SystemSource]:
    """The sources of the declared systems that ``systems`` uses: from ``given`` (what
    :func:`declare_systems` returned), else as this process declared them; ``ValueError``
    for one it has not declared."""
    out = {}
    for name in systems:
        if name not in declarations:
            continue
        source = (given or {}).get(name) or _DECLARED.get(name)
        if source is None:
            raise ValueError(
                f"system {name!r} (define_systems.{name}) is not declared in this process: "
                "resolve the config with tasks.config.resolve_config, or call "
                "tasks.config.declare_systems on it before validating it"
            )
        out[name] = source
    return out


def declared_data(
    data: Any,
    system: str,
    sources: Mapping[str, SystemSource],
    declarations: Mapping[str, SystemDeclaration],
) -> Any:
    """``data`` (a ``DataConfig``) for the cells of ``system``: a declared system's carry its
    source, its own ``n_observed`` where the run sets none, and at most the trajectories and
    times it has (a data file of 150 trajectories under a profile asking for 200 uses 150)."""
    source = sources.get(system)
    if source is None:
        return data
    from datasets import SYSTEMS

    info = SYSTEMS[system]
    return data.model_copy(
        update={
            "source": source,
            "n_observed": data.n_observed or declarations[system].n_observed,
            "n_trajectories": min(data.n_trajectories or 10**9, info.default_trajectories),
            "n_points": min(data.n_points or 10**9, info.default_points),
        }
    )


def declared_names(layer: Mapping[str, Any]) -> tuple[str, ...]:
    """The system names a config layer declares (read without validating it)."""
    defs = layer.get("define_systems")
    return tuple(defs) if isinstance(defs, Mapping) else ()
