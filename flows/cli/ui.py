"""``nllab ui``: the MLflow UI on the tracking store, opened on the model-training view."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from flows.cli.common import EXIT_INTERRUPTED, EXIT_USAGE, port

__all__ = ["add_parser", "port_in_use", "run", "runs_view_url", "ui_command", "ui_environment"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ui", help="start the MLflow UI on the tracking store")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=5000, help="1 to 65535 (default 5000)")
    p.add_argument(
        "--allowed-hosts",
        metavar="HOSTS",
        help="host names the UI answers to when bound beyond localhost (MLflow's security check)",
    )
    p.add_argument(
        "--no-browser", action="store_true", help="print the address, do not open a browser"
    )
    p.set_defaults(handler=run)
    return p


def ui_command(host: str, port: int, allowed_hosts: str | None = None) -> tuple[list[str], str]:
    """The ``mlflow ui`` command for the configured store, and the address it will serve."""
    from tasks.tracking import TrackingSettings

    s = TrackingSettings.resolve()
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", s.tracking_uri]
    cmd += ["--registry-store-uri", s.tracking_uri]
    if s.artifact_root:
        cmd += ["--default-artifact-root", s.artifact_root]
    cmd += ["--host", host, "--port", str(port)]
    # One worker serves one user's browser and starts in a third of the time of MLflow's
    # default four; uvicorn's per-process start and stop lines are left out.
    cmd += ["--workers", "1", "--uvicorn-opts", "--log-level warning"]
    if allowed_hosts:
        cmd += ["--allowed-hosts", allowed_hosts]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return cmd, f"http://{shown}:{port}"


def runs_view_url(address: str, experiment_id: str, view: str | None = None) -> str:
    """The experiment's runs in MLflow's model-training view (not the GenAI one), in the saved
    view ``view`` (:meth:`tasks.tracking.Queries.set_ui_view`) if given."""
    shared = f"viewStateShareKey={view}&" if view else ""
    return f"{address}/#/experiments/{experiment_id}/runs?{shared}workflowType=machine_learning"


#: Warnings of the MLflow server's own libraries that a user of the UI cannot act on: Starlette
#: deprecations inside MLflow's server code (a ``UserWarning`` subclass, so matched by text).
_SERVER_WARNINGS = (
    "ignore:starlette.middleware.wsgi is deprecated",
    "ignore::DeprecationWarning",
)


#: Start-up lines of the MLflow server that say nothing a user of ``nllab ui`` acts on: its
#: security middleware's default (localhost-only) is what ``nllab ui`` binds anyway, and
#: ``--allowed-hosts`` is ``nllab ui``'s own option.
_SERVER_CHATTER = ("[MLflow] Security middleware enabled",)


def _forward_errors(stream) -> None:
    """Copy the server's stderr to ours, line by line, without its start-up chatter."""
    for line in stream:
        if not line.startswith(_SERVER_CHATTER):
            sys.stderr.write(line)
            sys.stderr.flush()


def ui_environment() -> dict[str, str]:
    """The UI server's environment: no job workers (7 processes, ~1.3 GB, that the UI does
    not need) and no deprecation warnings of the libraries inside it."""
    warnings = [w for w in os.environ.get("PYTHONWARNINGS", "").split(",") if w]
    return {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "PYTHONWARNINGS": ",".join([*warnings, *_SERVER_WARNINGS]),
    }


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be served on (``None`` when it can), with what to change: the
    port when something listens there or it needs privileges, the host when it is not an
    address of this machine."""
    import errno

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # as servers do: connections in TIME_WAIT do not block, a listening socket does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror as e:  # a name that does not resolve
            return f"{e.strerror or e}; choose another with --host (default 127.0.0.1)"
        except OSError as e:
            reason = e.strerror or str(e)
            if e.errno == errno.EADDRINUSE:
                return (
                    f"{reason} (another program, perhaps another MLflow UI, is there); "
                    "choose another with --port"
                )
            if e.errno == errno.EACCES:
                return f"{reason}; choose a port above 1023 with --port"
            return f"{reason}; --host names an address of this machine (default 127.0.0.1)"
    return None


def _ready(address: str, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{address}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def _stop(proc: subprocess.Popen) -> None:
    """End the UI and every process it started (its own process group)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run(args: argparse.Namespace) -> int:
    from tasks.tracking import TrackingSettings, connect

    settings = TrackingSettings.resolve()
    if settings.tracking_uri.startswith(("http://", "https://")):
        print(f"runs are tracked on the server {settings.tracking_uri}: open it in a browser")
        return 0
    busy = port_in_use(args.host, args.port)
    if busy:
        print(
            f"nllab ui: error: cannot serve on {args.host}:{args.port}: {busy}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    queries = connect().queries  # creates the embedded store if needed; fails clearly if unusable
    view = queries.set_ui_view()
    cmd, address = ui_command(args.host, args.port, args.allowed_hosts)
    url = runs_view_url(address, queries.experiment_id, view)
    print(f"nllab ui: starting the MLflow UI on {settings.tracking_uri} …", flush=True)
    # Its own process group, so stopping it also stops the server processes it starts.
    proc = subprocess.Popen(
        cmd, env=ui_environment(), start_new_session=True, stderr=subprocess.PIPE, text=True
    )
    threading.Thread(target=_forward_errors, args=(proc.stderr,), daemon=True).start()

    try:
        if _ready(address, proc, 90.0):
            print(f"  open {url}  (Ctrl-C to stop)", flush=True)
            if not args.no_browser and sys.stdout.isatty():
                import webbrowser

                webbrowser.open(url)
        elif proc.poll() is None:
            print(f"  not answering yet; try {url}  (Ctrl-C to stop)", flush=True)
        code = proc.wait()
        if code:
            print(f"nllab ui: error: the MLflow UI exited with code {code}", file=sys.stderr)
        return code
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (143): nllab's stop signals
        return getattr(e, "exit_code", EXIT_INTERRUPTED)
    finally:
        _stop(proc)
