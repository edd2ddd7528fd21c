"""``nllab serve [--config FILE]``: Prefect deployments of the benchmark and of studies on cron.

The schedules come from a TOML file (default: ``flows/schedules.toml``: the smoke benchmark
nightly, chosen studies weekly). Every entry is validated before anything is served; a malformed
entry is a :class:`ScheduleError` naming it.

Schedules need a Prefect server: the temporary server that flows start on their own cannot
schedule ("Cannot schedule flows on an ephemeral server"). With ``PREFECT_API_URL`` set, the
deployments are served against that server; without it, ``--start-server`` starts
``prefect server start`` (offline, 127.0.0.1) for the lifetime of the command, otherwise the
command explains how to start one.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from collections.abc import Callable
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

from flows.cli.serve import add_parser as add_serve_parser  # loads without Prefect
from tasks.config import Profile

__all__ = [
    "DEFAULT_SCHEDULES",
    "BenchmarkEntry",
    "ScheduleError",
    "ServeLease",
    "ServerMissing",
    "TuneEntry",
    "add_serve_parser",
    "build_deployments",
    "cmd_serve",
    "load_schedules",
    "pause_deployments",
    "scheduled_benchmark",
    "scheduled_study",
    "scheduled_tune",
]

DEFAULT_SCHEDULES = Path(__file__).resolve().parent / "schedules.toml"


class ScheduleError(ValueError):
    """A schedules file or entry is malformed; the message names the entry."""


class ServerMissing(RuntimeError):
    """No Prefect server to schedule on; the message says how to start one."""


# -- deployable flows (resolved at run time, so each run reads the current settings) ----------
@flow(name="nllab-scheduled-benchmark", log_prints=True)
def scheduled_benchmark(profile: str = "smoke", config: dict[str, Any] | None = None) -> str:
    """The benchmark at ``profile`` with run-config overrides ``config``; returns a summary."""
    from flows.benchmark import run_benchmark
    from tasks.config import resolve_config

    summary = run_benchmark(
        resolve_config(profile, overrides={"progress": False, **(config or {})})
    )
    return f"{len(summary.results)} cells, {summary.count('failed')} failed"


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


# -- the Prefect server -------------------------------------------------------------------------
def _api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def require_server(api_url: str | None) -> str:
    if api_url:
        return api_url
    raise ServerMissing(
        "schedules need a Prefect server; the temporary one that flows start on their own "
        "cannot schedule. Either\n"
        "  1. start one (offline; UI on http://127.0.0.1:4200):\n"
        "       prefect server start --host 127.0.0.1 --port 4200\n"
        "     then, in this shell:\n"
        "       export PREFECT_API_URL=http://127.0.0.1:4200/api\n"
        "       nllab serve\n"
        "  2. or let this command start one for as long as it runs:\n"
        "       nllab serve --start-server"
    )


def _healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def start_server(port: int = 4200, timeout: float = 90.0) -> tuple[subprocess.Popen, str]:
    """Start ``prefect server start`` on 127.0.0.1:``port``; returns the process and API URL."""
    api = f"http://127.0.0.1:{port}/api"
    if _healthy(api):
        raise ServerMissing(f"a server already answers on {api}: export PREFECT_API_URL={api}")
    exe = Path(sys.executable).with_name("prefect")
    cmd = [str(exe) if exe.exists() else "prefect", "server", "start"]
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerMissing(f"`prefect server start` exited with code {proc.returncode}")
        if _healthy(api):
            return proc, api
        time.sleep(1.0)
    proc.terminate()
    raise ServerMissing(f"the Prefect server did not answer on {api} within {timeout:.0f} s")


# -- instances sharing one server ---------------------------------------------------------------
#: The Prefect variable listing the live ``nllab serve`` instances of a server and what each
#: serves (``{instance: {"deployments": [FLOW/NAME, ...], "beat": UNIX_SECONDS}}``).
REGISTRY_VARIABLE = "nllab_serve_instances"
#: Seconds between an instance's heartbeats (and health checks of the server).
BEAT_SECONDS = 10.0
#: An instance whose last heartbeat is older than this is gone (killed without cleaning up).
STALE_SECONDS = 60.0
#: Failed health checks in a row after which the server counts as gone.
MISSES = 2


class ServeLease:
    """This process's entry among the live ``nllab serve`` instances of one Prefect server.

    Instances with the same schedules serve the same deployments; Prefect's own shutdown pauses
    every deployment its runner served, so one instance's Ctrl-C would pause the others'. Instead,
    each instance beats in a server-side variable, and on exit pauses only the deployments that
    no other live instance serves (:meth:`release`). A watcher thread (:meth:`watch`) also checks
    the server's health: once it stops answering, the instance is told to stop.
    """

    def __init__(self, api_url: str, deployments: list[str]) -> None:
        import socket

        self.api_url = api_url
        self.deployments = sorted(deployments)
        self.instance = f"{socket.gethostname()}/{os.getpid()}/{os.urandom(3).hex()}"
        self.server_lost = threading.Event()
        self._done = threading.Event()

    def _entries(self) -> dict[str, Any]:
        from prefect.variables import Variable

        value = Variable.get(REGISTRY_VARIABLE, default=None)
        return dict(value) if isinstance(value, dict) else {}

    def _store(self, entries: dict[str, Any]) -> None:
        from prefect.variables import Variable

        Variable.set(REGISTRY_VARIABLE, entries, overwrite=True)

    def beat(self) -> None:
        """Record (or refresh) this instance; entries gone stale are dropped."""
        now = time.time()
        entries = {
            k: v
            for k, v in self._entries().items()
            if isinstance(v, dict) and now - float(v.get("beat", 0)) < STALE_SECONDS
        }
        entries[self.instance] = {"deployments": self.deployments, "beat": now}
        self._store(entries)

    def served_by_others(self) -> set[str]:
        now = time.time()
        return {
            name
            for k, v in self._entries().items()
            if k != self.instance
            and isinstance(v, dict)
            and now - float(v.get("beat", 0)) < STALE_SECONDS
            for name in v.get("deployments", ())
        }

    def release(self) -> list[str]:
        """Remove this instance; the deployments that no other live instance serves (the ones
        to pause)."""
        self._done.set()
        others = self.served_by_others()
        entries = self._entries()
        entries.pop(self.instance, None)
        self._store(entries)
        return [d for d in self.deployments if d not in others]

    def watch(self, on_lost: Callable[[], None], every: float = BEAT_SECONDS) -> threading.Thread:
        """Beat every ``every`` seconds in a daemon thread; after :data:`MISSES` failed health
        checks in a row, set :attr:`server_lost` and call ``on_lost`` once."""
        import contextvars

        def loop() -> None:
            misses = 0
            while not self._done.wait(every):
                if _healthy(self.api_url, timeout=min(every, 3.0)):
                    misses = 0
                    try:
                        self.beat()
                    except Exception:  # a hiccup of the server: the next beat repairs it
                        pass
                    continue
                misses += 1
                if misses >= MISSES:
                    self.server_lost.set()
                    on_lost()
                    return

        context = contextvars.copy_context()  # Prefect's settings (the API URL) included
        thread = threading.Thread(target=context.run, args=(loop,), daemon=True)
        thread.start()
        return thread


def pause_deployments(names: list[str]) -> None:
    """Pause the deployments ``FLOW/NAME`` (their schedules stop making runs)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for name in names:
            client.pause_deployment(client.read_deployment_by_name(name).id)


_CONNECTION_MODULES = ("websockets", "httpx", "httpcore")


class _NoConnectionTracebacks(logging.Filter):
    """Keeps the line of a console record about a lost connection to the server (Prefect's
    runner logs one per reconnect attempt), without its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        module = type(error).__module__ if error is not None else ""
        if isinstance(error, OSError) or module.split(".")[0] in _CONNECTION_MODULES:
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_connection_errors() -> None:
    quiet = _NoConnectionTracebacks()
    for name in ("", "prefect"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.addFilter(quiet)


def _interrupt_main() -> None:
    """Stop ``serve`` in the main thread as Ctrl-C does."""
    import signal

    os.kill(os.getpid(), signal.SIGINT)


# -- command line -------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    """Handler of ``nllab serve``: 2 on a malformed schedule or no server, else serves."""
    try:
        entries = load_schedules(args.config)
    except ScheduleError as e:
        print(f"nllab serve: error: {e}", file=sys.stderr)
        return 2
    for e in entries:
        state = " (paused)" if e.paused else ""
        print(f"  {e.name:<44} {e.flow:<9} cron '{e.cron}' {e.timezone}{state}")
    if args.check:
        return 0
    server = None
    api = _api_url()
    try:
        if not api and args.start_server:
            server, api = start_server(args.port)
            print(f"started a Prefect server: {api} (UI http://127.0.0.1:{args.port})")
        require_server(api)
    except ServerMissing as e:
        print(f"nllab serve: error: {e}", file=sys.stderr)
        return 2
    from prefect import serve
    from prefect.settings import PREFECT_API_URL, temporary_settings

    lease = None
    try:
        with temporary_settings({PREFECT_API_URL: api}):
            deployments = build_deployments(entries)
            lease = ServeLease(api, [f"{d.flow_name}/{d.name}" for d in deployments])
            print(f"serving {len(entries)} deployments on {api} (Ctrl-C to stop)")
            # Prefect's own hint, `prefect deployment run NAME`, needs this in the other shell.
            print(
                f"to trigger one from another shell, first: export PREFECT_API_URL={api}",
                flush=True,
            )
            lease.beat()
            lease.watch(_interrupt_main)
            _quiet_connection_errors()
            # Not Prefect's pause of every served deployment at exit: another instance may
            # serve them too. This one pauses what no other live instance serves (below).
            try:
                serve(*deployments, pause_on_shutdown=False)
            except KeyboardInterrupt:
                pass
            if lease.server_lost.is_set():
                print(
                    f"nllab serve: error: the Prefect server at {api} stopped answering; "
                    "stopped serving (start the server again, then run `nllab serve`)",
                    file=sys.stderr,
                )
                return 3
            alone = lease.release()
            if alone:
                pause_deployments(alone)
            kept = len(lease.deployments) - len(alone)
            print(
                f"paused {len(alone)} deployments"
                + (f"; {kept} stay served by another nllab serve" if kept else "")
            )
    finally:
        if lease is not None:
            lease._done.set()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    return 0
