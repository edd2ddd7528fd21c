"""Serving deployments from several ``nllab serve`` instances on one Prefect server: each
instance's lease (a heartbeat in a server-side variable), pausing at exit only what no other
live instance serves, and stopping once the server stops answering."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from flows.runtime import healthy
from tasks.stopping import Stopped

__all__ = [
    "BEAT_SECONDS",
    "MISSES",
    "REGISTRY_VARIABLE",
    "STALE_SECONDS",
    "ServeLease",
    "ServeOutcome",
    "pause_deployments",
    "serve_deployments",
]

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
                if healthy(self.api_url, timeout=min(every, 3.0)):
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
    """Pause the deployments ``FLOW/NAME`` (their schedules stop making runs); one that a
    Ctrl-C kept from being created has nothing to pause."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for name in names:
            try:
                client.pause_deployment(client.read_deployment_by_name(name).id)
            except ObjectNotFound:
                continue


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


@dataclass(frozen=True)
class ServeOutcome:
    """How serving ended: the server stopped answering, or a stop signal (``signum``: Ctrl-C,
    SIGTERM) after which ``paused`` deployments were paused (``kept`` others stay served by
    another instance)."""

    server_lost: bool
    paused: tuple[str, ...] = ()
    kept: int = 0
    signum: int = signal.SIGINT


def _serve(deployments: list, lease: ServeLease) -> int:
    """Prefect's runner serving ``deployments``, built as :func:`prefect.serve` builds it but
    without its pause of every served deployment at exit (another instance may serve them:
    :meth:`ServeLease.release` decides), until a stop signal (which one: Prefect's runner takes
    SIGTERM over while it runs, as a graceful shutdown; its handler here remembers it, so that
    the command exits 143) or until the lease finds the server gone: then the lease's watcher
    stops the runner on the runner's own event loop (:meth:`prefect.runner.Runner.astop`, as
    Prefect's own SIGTERM handler does)."""
    import asyncio

    from prefect.exceptions import TerminationSignal
    from prefect.runner import Runner

    class _Runner(Runner):
        signum = signal.SIGINT

        def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
            self.signum = signal.SIGTERM
            if not self.started or self.stopping or self._loop is None:
                raise Stopped(signal.SIGTERM)  # (Prefect's own: sys.exit(0))
            super().handle_sigterm(*args, **kwargs)

    runner = _Runner(pause_on_shutdown=False)
    for deployment in deployments:
        runner.add_deployment(deployment)

    def stop() -> None:
        if runner.started:
            runner.execute_in_background(runner.astop)

    lease.watch(stop)
    try:
        asyncio.run(runner.start())
    except KeyboardInterrupt as e:
        return getattr(e, "signum", signal.SIGINT)
    except TerminationSignal:  # as prefect.serve: a stop, then the pause that follows
        pass
    return runner.signum


def serve_deployments(entries: list, api: str) -> ServeOutcome:
    """Serve the deployments of schedule ``entries`` on the server at ``api`` until Ctrl-C or
    until the server stops answering; at exit pause what no other live instance serves."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.serve.deployments import build_deployments

    lease = None
    try:
        with temporary_settings({PREFECT_API_URL: api}):
            deployments = build_deployments(entries)
            lease = ServeLease(api, [f"{d.flow_name}/{d.name}" for d in deployments])
            # A Ctrl-C or SIGTERM from here on (serving, or still starting to, even as the lines
            # that say so are printed: a terminal's Ctrl-C may follow them at once) pauses.
            signum: int = signal.SIGINT
            try:
                print(f"serving {len(entries)} deployments on {api} (Ctrl-C to stop)")
                # Prefect's own hint, `prefect deployment run NAME`, needs this in the other
                # shell.
                print(
                    f"to trigger one from another shell, first: export PREFECT_API_URL={api}",
                    flush=True,
                )
                lease.beat()
                _quiet_connection_errors()
                # Not Prefect's pause of every served deployment at exit: another instance may
                # serve them too. This one pauses what no other live instance serves (below).
                signum = _serve(deployments, lease)
            except KeyboardInterrupt as e:
                signum = getattr(e, "signum", signal.SIGINT)
            if lease.server_lost.is_set():
                return ServeOutcome(server_lost=True)
            alone = lease.release()
            if alone:
                pause_deployments(alone)
            kept = len(lease.deployments) - len(alone)
            return ServeOutcome(False, tuple(alone), kept, signum)
    finally:
        if lease is not None:
            lease._done.set()
