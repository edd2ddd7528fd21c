"""Ctrl-C in the middle of a real `nllab benchmark` process loses no finished cell (slow: two
processes each start their own local Prefect server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARGS = [
    "benchmark", "--profile", "smoke", "--systems", "integro_de", "piecewise_forcing_ode",
    "--methods", "node", "neural_laplace", "nf_coupling", "--epochs", "40", "--max-workers", "1",
    "--no-progress",
]  # fmt: skip


def _nllab(home: Path, isolation: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "NLLAB_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
        "NLLAB_ARTIFACT_ROOT": str(home / "artifacts"),
    }
    env.pop("PREFECT_API_URL", None)  # its own local server, not the test harness's
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *ARGS, "--config", str(_config(home, isolation))],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _config(home: Path, isolation: str) -> Path:
    path = home / "isolation.toml"
    path.write_text(f'isolation = "{isolation}"\n')
    return path


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctrl_c_keeps_finished_cells_and_rerun_resumes(tmp_path, isolation):
    from tasks.config import TrackingConfig
    from tasks.tracking import Tracker

    proc = _nllab(tmp_path, isolation)
    lines = []
    deadline = time.monotonic() + 300
    # Wait until at least one training cell has finished, then press Ctrl-C.
    for line in proc.stdout:
        lines.append(line)
        if "Task run 'integro_de/" in line and "Completed()" in line:
            break
        assert time.monotonic() < deadline, "".join(lines)
    proc.send_signal(signal.SIGINT)
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, out
    assert "interrupted; finished cells are kept" in out

    tracker = Tracker.connect(TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    runs = tracker.client.search_runs([tracker.experiment_id], "tags.`nllab.kind` = 'cell'")
    status = {r.info.run_id: r.info.status for r in runs}
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert finished and len(finished) < 6
    assert all("test_rmse" in r.data.metrics for r in finished)
    assert set(status.values()) <= {"FINISHED", "KILLED"}  # nothing left looking successful
    (parent,) = tracker.client.search_runs(
        [tracker.experiment_id], "tags.`nllab.kind` = 'benchmark'"
    )
    assert parent.info.status == "KILLED"

    proc = _nllab(tmp_path, isolation)
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, out
    assert f"6 cells: {6 - len(finished)} finished, {len(finished)} reused, 0 failed" in out
