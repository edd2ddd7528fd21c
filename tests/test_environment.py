"""The process is set up (offline switches, tracking defaults) before mlflow or prefect load,
whichever module a program imports first."""

from __future__ import annotations

import json
import os
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
                "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED")]
        return None
sys.meta_path.insert(0, Spy())
import importlib
importlib.import_module(sys.argv[1])
print(json.dumps(seen))
"""


@pytest.mark.parametrize(
    "first", ["tasks.tracking", "tasks.prefect_tasks", "flows.benchmark", "flows._runtime"]
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
        assert values == ["true", "true", "false"], (first, name, values)


_OFFLINE = ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED")
