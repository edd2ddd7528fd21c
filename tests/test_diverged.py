"""A model that never learned finishes, is flagged (run tag, results table, one line) and is
never registered: the rule of :func:`nltrain.divergence`, and a benchmark with an
absurd learning rate run as a user would."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nltrain import EpochRecord, divergence
from nltrain._evaluation import DIVERGED_RMSE_FACTOR

ROOT = Path(__file__).resolve().parent.parent


def _history(*pairs: tuple[float, float]) -> list[EpochRecord]:
    """Epochs of (train loss, validation RMSE)."""
    return [EpochRecord(i, loss, loss, val, 0.1, 0) for i, (loss, val) in enumerate(pairs)]


def test_the_divergence_rule():
    target = np.full((4, 5, 2), 2.0)  # RMS 2: the limit is 2 * DIVERGED_RMSE_FACTOR
    learned = _history((1.0, 1.0), (0.5, 0.6))
    limit = 2.0 * DIVERGED_RMSE_FACTOR
    assert divergence(learned, 0.3, target) is None
    assert divergence(learned, limit, target) is None  # at the limit: still a model
    assert "over 100x the data's scale" in divergence(learned, limit * 1.01, target)
    assert divergence(learned, float("inf"), target) is not None
    worse = _history((1.0, 1.0), (2.0, 3.0), (4.0, 5.0))  # best epoch 0, the loss rose
    assert "best epoch 0 of 3 and the training loss rose (1 to 4)" in divergence(worse, 1, target)
    # best epoch 0 alone (a noisy validation) or one epoch is not enough
    assert divergence(_history((1.0, 1.0), (0.9, 1.1)), 1.0, target) is None
    assert divergence(_history((1.0, 1.0)), 1.0, target) is None


def _benchmark(home: Path, config: str, method: str, api: str) -> subprocess.CompletedProcess:
    (home.parent / "c.toml").write_text(config)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NLLAB_HOME": str(home), "PREFECT_API_URL": api}
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT"):
        env.pop(var, None)
    args = ["--config", str(home.parent / "c.toml"), "--systems", "integro_de", "--methods"]
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "benchmark", *args, method, "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.heavy  # a benchmark command in a process of its own
def test_a_benchmark_that_diverges_registers_nothing(tmp_path, prefect_api):
    home = tmp_path / "home"
    config = 'profile = "smoke"\n[training]\nlr = 1000.0\nepochs = 3\n'
    out = _benchmark(home, config, "neural_laplace", prefect_api)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "@champion" not in out.stdout
    lines = [x for x in out.stdout.splitlines() if x.startswith("cell ") and "diverged" in x]
    assert len(lines) == 1 and "integro_de/neural_laplace/seed0" in lines[0], out.stdout
    assert "never registered" in lines[0]
    assert "diverged in 1 of 1 seeds" in out.stdout  # the table's flag
    with sqlite3.connect(home / "mlflow" / "mlflow.db") as db:
        assert db.execute("select count(*) from registered_models").fetchone()[0] == 0
        assert db.execute("select count(*) from model_versions").fetchone()[0] == 0
        tags = db.execute("select value from tags where key = 'diverged'").fetchall()
        metric = db.execute("select value from latest_metrics where key = 'diverged'").fetchall()
    assert len(tags) == 1 and tags[0][0]
    assert metric == [(1.0,)]


@pytest.mark.heavy  # a benchmark command in a process of its own
def test_a_failed_cell_is_one_line_and_its_error_stays_in_its_run(tmp_path, prefect_api):
    home = tmp_path / "home"
    config = 'profile = "smoke"\nisolation = "process"\n[training]\nlr = 1e300\nepochs = 1\n'
    out = _benchmark(home, config, "node", prefect_api)  # the loss overflows: the cell fails
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "PackFailed" not in text
    assert "leaked semaphore" not in text
    lines = [x for x in text.splitlines() if "integro_de/node/seed0" in x and "Diverged" in x]
    assert len(lines) == 1, text
    errors = list((home / "mlflow" / "artifacts").rglob("error.txt"))
    # The whole error beside the run (a divergence is found, not raised: where and why it
    # happened is its message, the same whether the cell trained alone or in a pack).
    assert len(errors) == 1
    error = errors[0].read_text()
    assert "TrainingDiverged: integro_de/node/seed0: training loss is inf at epoch 0" in error


def test_the_table_flags_a_diverged_method_and_never_calls_it_best():
    from tasks.config import CellConfig
    from tasks.reports.reporting import results_table
    from tasks.results import CellResult

    def cell(method: str, rmse: float, diverged: float) -> CellResult:
        c = CellConfig(system="integro_de", method=method, seed=0)
        metrics = {"test_rmse": rmse, "best_epoch": 0.0, "diverged": diverged}
        return CellResult.fresh(c, f"run-{method}", metrics)

    table = results_table([cell("node", 0.5, 0.0), cell("anode", 0.1, 1.0)], profile="paper")
    assert table.frame.set_index("method")["n_diverged"].to_dict() == {"node": 0, "anode": 1}
    rows = {r[0].text: r[1] for r in table.main_table().rows}
    assert rows["node"].best and not rows["anode"].best
    assert rows["anode"].flag == "diverged in 1 of 1 seeds: never registered"
    assert not rows["node"].flag
    assert cell("anode", 0.1, 1.0).diverged == "test RMSE 0.1, best epoch 0"
