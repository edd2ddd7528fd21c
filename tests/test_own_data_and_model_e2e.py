"""The README's "your own data and your own model" as a user runs it, in a fresh home: the
example config (a data-file system and a plugin model, the plugin's entry point installed as a
``.dist-info`` on ``PYTHONPATH``, as ``pip install -e`` would) through benchmark → report →
registry (both models, as asked with ``--register``) → reproduce, each a subprocess of
``nllab``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "pendulum_lab.toml"


def _site(tmp: Path) -> Path:
    info = tmp / "site" / "nllab_deepsets-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nllab-deepsets\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[nllab.models]\ndeepsets = nllab_deepsets\n")
    return info.parent


@pytest.mark.slow
def test_own_data_and_plugin_model_benchmark_report_register_reproduce(tmp_path: Path) -> None:
    home = tmp_path / "home"
    paths = [ROOT, ROOT / "examples" / "nllab_deepsets", _site(tmp_path)]
    env = {**os.environ, "NLLAB_HOME": str(home), "PYTHONPATH": os.pathsep.join(map(str, paths))}
    env.pop("MLFLOW_TRACKING_URI", None)

    def nllab(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "flows.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=timeout,
        )

    bench = nllab(
        "benchmark",
        "--config",
        str(CONFIG),
        "--profile",
        "smoke",
        "--systems",
        "pendulum_lab",
        "--methods",
        "deepsets",
        "neural_laplace",
        "--register",
        "deepsets",
        "neural_laplace",
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    table = bench.stdout
    assert "pendulum_lab" in table and "deepsets" in table
    assert "neural-laplace-pendulum_lab version 1 is now @champion" in table
    assert "deepsets-pendulum_lab version 1 is now @champion" in table  # asked for by name

    report = nllab("report", "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr[-3000:]
    md = "\n".join(p.read_text() for p in (tmp_path / "report").rglob("*.md"))
    assert "pendulum_lab" in md and "deepsets" in md

    # the data-file system's registered model: its data rebuilt from the file, RMSE to 1e-9
    rep = nllab("reproduce", "models:/neural-laplace-pendulum_lab@champion", "--fresh-data")
    assert rep.returncode == 0, rep.stderr[-3000:]

    # the plugin's champion, registered because the benchmark was asked to, reproduced
    rep = nllab("reproduce", "models:/deepsets-pendulum_lab@champion")
    assert rep.returncode == 0, rep.stderr[-3000:]
