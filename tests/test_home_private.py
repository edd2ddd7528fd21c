"""A new home is private (mode 700): its MLflow store, artifacts, Prefect database and data are
nobody else's, as its logs (600) already were, whatever modes SQLite and MLflow give their own
files; a home others can read is said by ``nllab doctor``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from datasets import require_writable_home
from flows.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_command_makes_a_new_home_private_with_everything_in_it(tmp_path):
    home = tmp_path / "new" / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NLLAB_", "PREFECT_"))}
    env |= {"NLLAB_HOME": str(home), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "flows.cli", "systems"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert _mode(home) == 0o700 and (home / "prefect").is_dir()  # its stores inside


def test_the_home_check_makes_it_private_and_leaves_an_existing_one_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "fresh"))
    assert _mode(require_writable_home()) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("NLLAB_HOME", str(shared))
    assert _mode(require_writable_home()) == 0o755  # the user's own choice


def test_doctor_says_when_others_can_read_the_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("nltrain.numerics._pinned.pinned_mismatches", lambda: [])
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path))
    tmp_path.chmod(0o700)
    main(["doctor", "--fresh"])
    assert "home's mode" not in capsys.readouterr().out
    tmp_path.chmod(0o755)
    main(["doctor"])
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "home's mode" in x]
    assert line.lstrip().startswith("!") and f"(mode 755): chmod 700 {tmp_path}" in line
