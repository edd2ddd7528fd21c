"""``nllab serve [--config FILE]``: Prefect deployments of the benchmark and of studies on cron.

The schedules come from a TOML file (default: ``flows/schedules.toml``: the smoke benchmark
nightly, chosen studies weekly). Every entry is validated before anything is served; a malformed
entry is a :class:`ScheduleError` naming it.

Schedules need a Prefect server (:mod:`flows.prefect_server`); several ``nllab serve`` instances
may serve one server (:mod:`flows.serving`). The command itself is :mod:`flows.cli.serve`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from prefect import flow
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tasks.config import Profile

__all__ = [
    "DEFAULT_SCHEDULES",
    "BenchmarkEntry",
    "ScheduleError",
    "StudyEntry",
    "TuneEntry",
    "build_deployments",
    "load_schedules",
    "scheduled_benchmark",
    "scheduled_study",
    "scheduled_tune",
]

DEFAULT_SCHEDULES = Path(__file__).resolve().parent / "schedules.toml"


class ScheduleError(ValueError):
    """A schedules file or entry is malformed; the message names the entry."""


# -- deployable flows (resolved at run time, so each run reads the current settings) ----------
@flow(name="nllab-scheduled-benchmark", log_prints=True)
def scheduled_benchmark(profile: str = "smoke", config: dict[str, Any] | None = None) -> str:
    """The benchmark at ``profile`` with run-config overrides ``config``, then its comparison
    with the previous run of the same experiment (:func:`flows.compare.record_comparison`:
    on the parent run and as Prefect artifacts); returns a summary."""
    from flows.benchmark import run_benchmark
    from flows.compare import record_comparison
    from tasks.config import resolve_config
    from tasks.tracking import Tracker

    run_config = resolve_config(profile, overrides={"progress": False, **(config or {})})
    # a new parent run every night, even when every cell is reused: each night is compared
    summary = run_benchmark(run_config, always_record=True)
    comparison = record_comparison(Tracker.connect(run_config.tracking), summary.parent_run_id)
    regressed = comparison.regressions if comparison is not None else 0
    return f"{len(summary.results)} cells, {summary.count('failed')} failed, {regressed} regressed"


@flow(name="nllab-scheduled-tune", log_prints=True)
def scheduled_tune(study: dict[str, Any]) -> str:
    """One study (``TuneSpec`` fields); resumes the stored study and adds trials up to its size."""
    from flows.tune import run_tune
    from tasks.tuning import TuneSpec

    result = run_tune(TuneSpec.model_validate(study))
    return f"{result.study_name}: best {result.best_value:.6g} (trial {result.best_trial})"


@flow(name="nllab-scheduled-study", log_prints=True)
def scheduled_study(study: str, profile: str = "quick", systems: list[str] | None = None) -> str:
    """One of the paper's studies (``nllab study``) at ``profile``; finished cells are reused."""
    from flows.studies import run_study, study_config

    summary = run_study(study_config(study, profile, systems=systems))
    failed = sum(not c.ok for c in summary.cells)
    return f"study {study}: {len(summary.cells)} cells, {failed} failed"


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


class BenchmarkEntry(_Entry):
    flow: Literal["benchmark"]
    profile: Profile = "smoke"
    config: dict[str, Any] = Field(default_factory=dict, description="run-config overrides")

    def parameters(self) -> dict[str, Any]:
        from tasks.config import resolve_config

        resolve_config(self.profile, overrides=self.config)  # validate now, not at 2 a.m.
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
        return {**own, "spec": TuneSpec.model_validate(rest)}

    def parameters(self) -> dict[str, Any]:
        from tasks.search_spaces import search_space

        self.spec.run_config()  # unknown method or system: an error now
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
        from flows.studies import get_study, study_config

        get_study(self.study)  # unknown names: an error now, not at run time
        study_config(self.study, self.profile, systems=self.systems)
        return {"study": self.study, "profile": self.profile, "systems": self.systems}


Entry = Annotated[BenchmarkEntry | TuneEntry | StudyEntry, Field(discriminator="flow")]
_FLOWS = ("benchmark", "tune", "study")


class _EntryAdapter(BaseModel):
    entry: Entry


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(x) for x in e["loc"] if x not in ("entry", *_FLOWS))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown setting"
        parts.append(f"{where or 'entry'}: {msg}")
    return "; ".join(parts)


def load_schedules(path: str | Path | None = None) -> list[BenchmarkEntry | TuneEntry | StudyEntry]:
    """Read and validate every entry of a schedules file (default: ``flows/schedules.toml``)."""
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


def build_deployments(entries: list[BenchmarkEntry | TuneEntry | StudyEntry]) -> list:
    """Prefect ``RunnerDeployment`` objects with the entries' cron schedules (nothing served)."""
    flows = {"benchmark": scheduled_benchmark, "tune": scheduled_tune, "study": scheduled_study}
    return [
        flows[e.flow].to_deployment(
            name=e.name,
            schedules=[e.schedule()],
            paused=e.paused,
            parameters=e.parameters(),
            description=e.description or f"nllab {e.flow} on '{e.cron}' ({e.timezone})",
            tags=["nllab", e.flow],
        )
        for e in entries
    ]
