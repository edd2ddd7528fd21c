"""The process is set up (offline switches, tracking defaults) before mlflow or prefect load,
whichever module a program imports first."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SPY = """
import json, os, sys
seen = {}
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name in ("mlflow", "prefect") and name not in seen:
            seen[name] = [os.environ.get(k) for k in (
                "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED",
                "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")]
        return None
sys.meta_path.insert(0, Spy())
import importlib
importlib.import_module(sys.argv[1])
print(json.dumps(seen))
"""


@pytest.mark.parametrize(
    "first",
    [
        "tasks.tracking._store",
        # (the two that import the most, a fresh interpreter each: the heavy tier)
        pytest.param("tasks.prefect_tasks", marks=pytest.mark.heavy),
        pytest.param("flows.benchmark", marks=pytest.mark.heavy),
        "flows.runtime._prefect",
    ],
)
def test_offline_switches_are_set_before_mlflow_and_prefect_load(first, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _OFFLINE}
    env["NLLAB_HOME"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", _SPY, first],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen, f"importing {first} loaded neither mlflow nor prefect"
    for name, values in seen.items():
        assert values == ["true", "true", "false", "true"], (first, name, values)


_OFFLINE = (
    "MLFLOW_DISABLE_TELEMETRY",
    "DO_NOT_TRACK",
    "PREFECT_SERVER_ANALYTICS_ENABLED",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",  # a server's "🏃 View run …" lines
)


#: What must never reach a user's console: warnings they cannot act on, and bookkeeping.
_NOISE = (
    "Warning",  # any Python warning: MLflow's type hints, torch's non-writable arrays, …
    "type hints",
    "not writable",
    "how-to-guides",  # Prefect's link after "Starting temporary server"
    "INFO mlflow",  # MLflow's store creation and input-example checks
    "\r",  # a progress bar redrawn in place
)


@pytest.mark.heavy  # a whole smoke benchmark in a process of its own
def test_smoke_benchmark_console_is_quiet_when_redirected(tmp_path):
    """A smoke benchmark with its output redirected: no warning or bookkeeping line, no bar
    redraws but one line per finished cell, one Prefect line per task."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NLLAB_"))},
        "PYTHONPATH": str(ROOT),
        "NLLAB_HOME": str(tmp_path / "home"),
        "NLLAB_HEARTBEAT_SECONDS": "0.2",  # the minute's silence of a long run, shortened
    }
    argv = "benchmark --profile smoke --systems integro_de --methods node neural_laplace"

    def benchmark() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "flows.cli", *argv.split(), "--epochs", "1"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    r = benchmark()
    assert r.returncode == 0, r.stderr
    both = r.stdout + r.stderr
    for noise in _NOISE:
        assert noise not in both, (noise, both)
    cells = [line for line in both.splitlines() if " integro_de/" in line and "test RMSE" in line]
    assert len(cells) == 2 and any("cell 2/2 " in line for line in cells), both
    # each says which seconds it gives: the cell's own training, the time since training began
    assert all(re.search(r"\(trained \d+ s, \d+ s since training started\)$", c) for c in cells)
    # silent phases (simulation, training) say that they are still moving
    beats = [line for line in r.stdout.splitlines() if line.startswith("… ")]
    assert any("since training started" in line for line in beats), r.stdout
    assert "2 cells: 0 already finished (reused), 2 to run in 2 packs" in both
    finished = [line for line in both.splitlines() if "Finished in state Completed()" in line]
    names = [line.split(" - ")[0].split("|")[-1].strip() for line in finished]
    assert len(names) == len(set(names)), finished  # one line per task (and the flow)
    assert "Starting temporary server" in r.stderr  # the notice stays, without its link

    # Run again, every cell reused: no Prefect server is started (nothing is left to run).
    again = benchmark()
    assert again.returncode == 0, again.stderr
    assert "2 cells: 0 finished, 2 reused" in again.stdout, again.stdout
    assert "Starting temporary server" not in again.stdout + again.stderr


def test_prefects_exit_countdown_is_dropped_and_its_other_warnings_kept():
    """Prefect's events worker counts down what it still sends while a command exits ("Still
    processing items: …"), after the command's last line; its other warnings stay."""
    probe = (
        "import logging; from tasks import configure_environment; configure_environment(); "
        "lg = logging.getLogger('EventsWorker'); "
        "mk = lambda m: lg.makeRecord('EventsWorker', logging.WARNING, 'f', 1, m, (), None); "
        "print(bool(lg.filter(mk('Still processing items: 1 items remaining...'))), "
        "bool(lg.filter(mk('Service %r queue is full (%d items), dropping item'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["False", "True"]


@pytest.mark.heavy  # a command's imports traced in processes of their own
@pytest.mark.parametrize("api_url", ["http://127.0.0.1:9/api", ""])
def test_prefects_server_code_loads_only_in_a_process_that_starts_a_server(api_url, tmp_path):
    """Prefect's API (``prefect.server.api.server``, seconds of CPU to import) is what a
    temporary server runs: a command with ``PREFECT_API_URL`` set never loads it, one without
    loads it where its flow's settings make ready to start one. Nor does importing the models
    load TorchDynamo (3 s): a model's first call does, where it may run under ``torch.compile``."""
    probe = (
        "import sys, flows.benchmark; before = 'prefect.server.api.server' in sys.modules; "
        "from flows.runtime._prefect import _guard_temporary_server; _guard_temporary_server(); "
        "from nlmodels import MODELS; assert 'neural_laplace' in MODELS; "
        "print(before, 'prefect.server.api.server' in sys.modules, 'torch._dynamo' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NLLAB_HOME": str(tmp_path)}
    env.pop("PREFECT_API_URL", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    # nor does importing the models load TorchDynamo (seconds too): their first call does
    assert out.stdout.split() == ["False", "False" if api_url else "True", "False"]
