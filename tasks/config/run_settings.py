"""The sections of a run configuration that say how it runs and where it is tracked, apart from
the experiment (:mod:`tasks.config` holds the experiment's sections): none of them enters a
cell's config hash. :class:`Frozen` (:class:`nltrain.Settings`) is the base of every config
section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from nltrain import Settings as Frozen
from tasks.config.names import BUILTIN_METHODS, check_known

__all__ = [
    "DEVICES",
    "EXECUTION_KEYS",
    "MAX_EXPERIMENT_NAME",
    "Device",
    "ExecutionConfig",
    "Frozen",
    "Reuse",
    "TrackingConfig",
]

#: Where cells train: ``auto`` measures which is faster (``tasks.machine.placement``).
Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)
#: The longest MLflow experiment name (MLflow refuses longer ones).
MAX_EXPERIMENT_NAME = 500
#: The most torch CPU threads a worker asks for (torch takes a C int; more threads than any
#: machine's cores only contend).
MAX_TORCH_THREADS = 1024


#: Dask's schemes of a scheduler address; tcp and tls ones name a host and a port.
DASK_SCHEMES: tuple[str, ...] = ("tcp", "tls", "inproc", "ucx")


def dask_address_problem(address: str) -> str | None:
    """Why ``address`` is not a Dask scheduler address (``None`` when it is one)."""
    scheme, sep, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if sep and scheme in DASK_SCHEMES:
        if scheme not in ("tcp", "tls") or (host and port.isdigit() and 0 < int(port) < 65536):
            return None
    return f"must be a scheduler address like tcp://HOST:8786, got {address!r}"


def checked_dask_address(address: str | None) -> str | None:
    """``address``, or ``ValueError`` with :func:`dask_address_problem` (a field validator)."""
    if address and (problem := dask_address_problem(address)) is not None:
        raise ValueError(problem)
    return address


def address_implies_dask(data: Any) -> Any:
    """A scheduler address means the Dask runner; with ``thread`` it would be ignored (a
    ``mode="before"`` validator of every model with ``dask_address`` and ``task_runner``)."""
    if isinstance(data, Mapping) and data.get("dask_address"):
        if data.get("task_runner", "dask") != "dask":
            raise ValueError(
                f'dask_address {data["dask_address"]!r} needs task_runner = "dask" '
                f"(got {data['task_runner']!r}); a scheduler address implies it"
            )
        data = {**data, "task_runner": "dask"}
    return data


class TrackingConfig(Frozen):
    """Where runs go. ``tracking_uri=None``: ``MLFLOW_TRACKING_URI``, else the embedded store."""

    tracking_uri: str | None = None
    experiment: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_EXPERIMENT_NAME,
        description="None: NLLAB_EXPERIMENT, else 'nllab'",
    )
    register_models: bool = Field(True, description="false: nothing is registered")
    register_methods: Literal["all", "none"] | tuple[str, ...] = Field(
        ("neural_laplace",),
        description="the methods whose best model per system a benchmark registers, each "
        "with the alias @champion: 'all', 'none' (or []) or a list of methods",
    )

    @field_validator("register_methods", mode="before")
    @classmethod
    def _one_method(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) and v not in ("all", "none") else v

    @field_validator("register_methods")
    @classmethod
    def _known_methods(cls, v: str | tuple[str, ...]) -> str | tuple[str, ...]:
        return v if isinstance(v, str) or not v else check_known("method", v, BUILTIN_METHODS)

    def registered(self, methods: tuple[str, ...]) -> tuple[str, ...]:
        """Of a run's ``methods``, those whose best model per system is registered."""
        wanted = self.register_methods
        if not self.register_models or wanted == "none":
            return ()
        return methods if wanted == "all" else tuple(m for m in methods if m in wanted)


#: Which finished cells a run reuses (:func:`tasks.machine.reuse.stored_results`).
Reuse = Literal["numerics", "config", "never"]


class ExecutionConfig(Frozen):
    """How a run executes: where and how many cells train at once, and how they are shown.

    None of it changes a cell's result, so none of it enters a config hash; the experiment
    (:class:`RunConfig` without this part) is what is hashed per cell and logged as parameters.
    """

    device: Device = "auto"
    max_workers: int = Field(2, ge=1, description="cells trained at the same time")
    torch_threads: int | None = Field(
        1,
        ge=1,
        le=MAX_TORCH_THREADS,
        description="torch CPU threads per worker; None: the cores shared by the workers",
    )
    task_runner: Literal["thread", "dask"] = "thread"
    isolation: Literal["process", "thread"] = Field(
        "process", description="train each cell in a worker process (thread: in the runner's)"
    )
    dask_address: str | None = None
    progress: bool = True
    pack: bool = Field(
        True,
        description="train cells that differ only in seed as one packed model (exact per cell)",
    )
    reuse: Reuse = Field(
        "numerics",
        description="which finished cells are reused: those of the same config hash whose "
        "numerics fingerprints equal today's (numerics), any of the same config hash (config), "
        "none (never)",
    )
    checkpoints: str | None = Field(
        None,
        description="folder where each training cell keeps a checkpoint between epochs, so "
        "that a cell stopped (Ctrl-C, a time limit, a lost machine) resumes there with the "
        "bytes it would have had; None: none",
    )
    checkpoint_minutes: float = Field(
        5.0, ge=0, le=10_000, description="least minutes between two checkpoints of a cell"
    )

    _scheduler_address = field_validator("dask_address")(checked_dask_address)
    _address_implies_dask = model_validator(mode="before")(address_implies_dask)


#: Settings of :class:`ExecutionConfig`, also accepted at the top level of a config file, a
#: profile or the command-line overrides (``max_workers = 4`` means ``execution.max_workers``).
EXECUTION_KEYS: tuple[str, ...] = tuple(ExecutionConfig.model_fields)
