"""``make setup``'s torch: ``TORCH_SPEC`` is pip's arguments (a CUDA build with its index, as the
GPU guide gives it), each word quoted for the shell; named, it is installed even over a torch
already in the virtualenv; unnamed, a torch already there is kept. Read from ``make -n`` (what
make would run), so nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _torch_lines(tmp_path: Path, *assignments: str) -> list[str]:
    argv = ["make", "-n", "-C", str(ROOT), "setup", f"VENV={tmp_path / 'venv'}", *assignments]
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
    )
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if "pip install --quiet 'torch" in line]


def test_torch_spec_names_a_cuda_build_and_its_index_in_one_command(tmp_path):
    spec = "torch==2.13.0+cu130 --index-url https://download.pytorch.org/whl/cu130"
    (line,) = _torch_lines(tmp_path, f"TORCH_SPEC={spec}")
    assert line.endswith(
        "-m pip install --quiet 'torch==2.13.0+cu130' '--index-url' "
        "'https://download.pytorch.org/whl/cu130'"
    )
    assert "import torch" not in line  # installed even over a torch already there
    (line,) = _torch_lines(tmp_path, "TORCH_SPEC=torch>=2.5")  # quoted: no shell redirection
    assert line.endswith("pip install --quiet 'torch>=2.5'")


def test_without_torch_spec_a_torch_already_there_is_kept(tmp_path):
    (line,) = _torch_lines(tmp_path)
    assert '-c "import torch" 2>/dev/null || ' in line
    assert line.endswith("pip install --quiet 'torch==2.13.0'")
