"""The schedules file of ``nllab serve``: its entries, validated before anything is served.

Loads with pydantic and the plain configuration only (study names from the catalog, tuning
specs, run configurations), so ``nllab serve --check`` answers without loading torch, MLflow
or Optuna; the deployable flows are :mod:`flows.serve.deployments`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tasks.config import Profile, RunConfig, validation_problems

__all__ = [
    "DEFAULT_SCHEDULES",
    "BenchmarkEntry",
    "ScheduleError",
    "StudyEntry",
    "TuneEntry",
    "load_schedules",
]

DEFAULT_SCHEDULES = Path(__file__).resolve().parent / "schedules.toml"


class ScheduleError(ValueError):
    """A schedules file or entry is malformed; the message names the entry."""


# -- the schedules file -------------------------------------------------------------------------
class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    cron: str
    timezone: str = "UTC"
    paused: bool = False
    description: str | None = None

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {v!r} (use an IANA name such as UTC)") from None
        return v

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, v: str) -> str:
        from prefect.client.schemas.schedules import CronSchedule

        try:
            CronSchedule(cron=v)
        except ValidationError:
            raise ValueError(
                f"invalid cron string {v!r}: expected 5 fields "
                "'minute hour day-of-month month day-of-week', e.g. '0 2 * * *'"
            ) from None
        return v

    def schedule(self):
        from prefect.schedules import Cron

        return Cron(self.cron, timezone=self.timezone)


def _check_changed_models(config: RunConfig) -> None:
    """Build (on the ``meta`` device) the models of an entry that changes model options from
    its profile's, so that a constructor's refusal is met now; the profiles' own models are
    the shipped ones (each is built in the tests), so an entry that changes none loads no
    torch (even listing the cells would)."""
    from tasks.config import resolve_config
    from tasks.machine import check_models_build

    if config.models != resolve_config(config.profile).models or config.cell_overrides:
        check_models_build(config.cells())


class BenchmarkEntry(_Entry):
    flow: Literal["benchmark"]
    profile: Profile = "smoke"
    config: dict[str, Any] = Field(default_factory=dict, description="run-config overrides")

    def parameters(self) -> dict[str, Any]:
        from tasks.config import resolve_config

        # validate now, not at 2 a.m.: the config, and each model it changes
        _check_changed_models(resolve_config(self.profile, overrides=self.config))
        return {"profile": self.profile, "config": self.config}


class TuneEntry(_Entry):
    """A scheduled tuning study: the schedule's own fields, and a :class:`tasks.tuning.TuneSpec`
    from the rest of the entry (``trials`` and ``study_name`` name its ``n_trials`` and ``name``;
    the profile defaults to ``quick``)."""

    flow: Literal["tune"]
    spec: Any

    @model_validator(mode="before")
    @classmethod
    def _collect_spec(cls, data: Any) -> Any:
        from tasks.tuning import TuneSpec

        if not isinstance(data, dict) or "spec" in data:
            return data
        own = {k: v for k, v in data.items() if k in _Entry.model_fields or k == "flow"}
        rest = {_SPEC_NAMES.get(k, k): v for k, v in data.items() if k not in own}
        rest = {"profile": "quick", "overrides": {"progress": False}, **rest}
        try:
            spec = TuneSpec.model_validate(rest)
        except ValidationError as e:  # named as the file names them (trials, study_name)
            file_names = {field: key for key, field in _SPEC_NAMES.items()}
            raise ValueError("; ".join(validation_problems(e, names=file_names))) from None
        return {**own, "spec": spec}

    def parameters(self) -> dict[str, Any]:
        from tasks.tuning.search_spaces import search_space

        # unknown method or system, a model its constructor refuses: an error now
        _check_changed_models(self.spec.run_config())
        search_space(self.spec.method)
        return {"study": self.spec.model_dump(mode="json")}


#: Schedule-file keys of a tuning entry -> :class:`tasks.tuning.TuneSpec` fields.
_SPEC_NAMES = {"trials": "n_trials", "study_name": "name"}


class StudyEntry(_Entry):
    flow: Literal["study"]
    study: str
    profile: Profile = "quick"
    systems: list[str] | None = None

    def parameters(self) -> dict[str, Any]:
        from flows.studies import check_study_name, study_config

        check_study_name(self.study)  # unknown names: an error now, not at run time
        study_config(self.study, self.profile, systems=self.systems)
        return {"study": self.study, "profile": self.profile, "systems": self.systems}


Entry = Annotated[BenchmarkEntry | TuneEntry | StudyEntry, Field(discriminator="flow")]
_FLOWS = ("benchmark", "tune", "study")


class _EntryAdapter(BaseModel):
    entry: Entry


def _describe(err: ValidationError) -> str:
    return "; ".join(validation_problems(err, skip=2))  # ("entry", the flow): the wrapper's


def load_schedules(path: str | Path | None = None) -> list[BenchmarkEntry | TuneEntry | StudyEntry]:
    """Read and validate every entry of a schedules file (default:
    ``flows/serve/schedules.toml``)."""
    p = Path(path) if path is not None else DEFAULT_SCHEDULES
    if not p.is_file():
        raise ScheduleError(f"schedules file {str(p)!r} does not exist")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ScheduleError(f"schedules file {str(p)!r} is not valid TOML: {e}") from None
    unknown = set(data) - {"schedule"}
    if unknown:
        raise ScheduleError(
            f"schedules file {str(p)!r}: unknown top-level key(s) {sorted(unknown)}; "
            "entries go in [[schedule]] tables"
        )
    raw = data.get("schedule", [])
    if not isinstance(raw, list) or not raw:
        raise ScheduleError(f"schedules file {str(p)!r} has no [[schedule]] entries")
    entries: list[BenchmarkEntry | TuneEntry | StudyEntry] = []
    for i, item in enumerate(raw, start=1):
        label = f"schedule entry {i}" + (
            f" ({item['name']!r})" if isinstance(item, dict) and "name" in item else ""
        )
        if not isinstance(item, dict) or item.get("flow") not in _FLOWS:
            got = item.get("flow") if isinstance(item, dict) else item
            raise ScheduleError(
                f"{str(p)!r}: {label}: flow must be one of {', '.join(map(repr, _FLOWS))}, "
                f"got {got!r}"
            )
        try:
            entry = _EntryAdapter.model_validate({"entry": item}).entry
            entry.parameters()
        except ValidationError as e:
            raise ScheduleError(f"{str(p)!r}: {label}: {_describe(e)}") from None
        except ValueError as e:  # ConfigError, unknown search space
            raise ScheduleError(f"{str(p)!r}: {label}: {e}") from None
        if entry.name in {x.name for x in entries}:
            raise ScheduleError(f"{str(p)!r}: {label}: duplicate name {entry.name!r}")
        entries.append(entry)
    return entries
