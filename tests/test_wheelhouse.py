"""The offline wheelhouse (``make wheelhouse``, ``scripts/wheelhouse.py``) carries the reference
package ``torchlaplace`` that ``make gpu-check`` times Neural Laplace beside, without torch:
it is downloaded without its dependencies, as ``torchdiffeq`` is. Read from the requirement
lists and ``make -n`` (nothing is downloaded)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_extra_comes_without_its_dependencies():
    wheelhouse = _wheelhouse()
    full, bare = wheelhouse.requirements(("reference",))
    assert "torchlaplace==0.0.4" in bare  # pip download --no-deps: torch stays out
    assert not any(wheelhouse._name(r).startswith("torch") for r in full)
    plain = wheelhouse.requirements()
    assert not any(r.startswith("torchlaplace") for r in plain[0] + plain[1])  # an extra


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_wheelhouse_adds_the_reference_extra(tmp_path):
    r = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "wheelhouse", f"VENV={tmp_path / 'venv'}"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if "scripts/wheelhouse.py" in ln]
    assert "--extra reference" in line
