"""``nllab doctor``: every section reported, exit 0 when this machine computes the pinned bytes,
1 naming the component otherwise, and the verdict kept for the next runs' tags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import nltrain
from flows.cli import main
from nltrain import Mismatch, last_pinned_check

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = (
    "CPU numerics",
    "BLAS and maths libraries",
    "native kernels",
    "CUDA",
    "installation",
    "stores",
    "bytes against the pins",
)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path))
    return tmp_path


def _fake_check(monkeypatch, mismatches):
    # the digests themselves are held to the pins by test_cpu_numerics; here: what is reported
    monkeypatch.setattr(nltrain._pinned, "pinned_mismatches", lambda: list(mismatches))


def test_doctor_reports_every_section_and_exits_0_when_as_pinned(home, monkeypatch, capsys):
    _fake_check(monkeypatch, [])
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert [s for s in SECTIONS if f"\n{s}\n" in out] == list(SECTIONS)
    assert "✓ mode" in out and "portable (asked: portable)" in out
    assert "training of node" in out and out.strip().endswith("nllab doctor: all as pinned")
    assert last_pinned_check().verdict == "as pinned"


def test_doctor_names_what_differs_exits_1_and_tags_the_next_runs(home, monkeypatch, capsys):
    differs = [Mismatch("training", "node", "0" * 16, nltrain.PINNED["training"]["node"])]
    _fake_check(monkeypatch, differs)
    assert main(["doctor", "--fresh"]) == 1
    captured = capsys.readouterr()
    assert "✗ training of node" in captured.out
    assert "nllab doctor: 1 problem:" in captured.err
    assert "training of node:" in captured.err
    # kept in the home: read back without computing, as a cell's run tags read it
    monkeypatch.setattr(nltrain._pinned, "pinned_mismatches", lambda: pytest.fail("recomputed"))
    assert last_pinned_check().verdict == "differs: training of node"
    assert main(["doctor"]) == 1  # warm: the kept check, no recomputation


def test_a_dependency_missing_from_the_environment_is_named_with_its_modules(tmp_path, monkeypatch):
    from tasks.doctor import check_installation

    package = tmp_path / "nllab_fake_pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "fine.py").write_text("import json\n")
    (package / "needs.py").write_text("import nllab_surely_not_installed.sub\n")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / "also.py").write_text("from nllab_surely_not_installed import x\n")
    (package / "broken.py").write_text("raise RuntimeError('at import')\n")
    (package / "__main__.py").write_text("raise SystemExit('an entry point is never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {f.label: f for f in check_installation(["nllab_fake_pkg"])}
    assert set(found) == {"nllab_surely_not_installed", "nllab_fake_pkg.broken"}
    missing = found["nllab_surely_not_installed"]
    assert missing.status == "fail" and missing.section == "installation"
    assert missing.value == (
        "not installed: needed by nllab_fake_pkg.inner.also, nllab_fake_pkg.needs"
    )
    assert "RuntimeError: at import" in found["nllab_fake_pkg.broken"].value
    (package / "needs.py").write_text("")
    (package / "inner" / "also.py").write_text("")
    (package / "broken.py").write_text("")
    for name in [m for m in sys.modules if m.startswith("nllab_fake_pkg")]:
        monkeypatch.delitem(sys.modules, name)
    assert [(f.label, f.value, f.status) for f in check_installation(["nllab_fake_pkg"])] == [
        ("modules", "6 imported", "ok")
    ]


@pytest.mark.slow
def test_doctor_in_the_native_mode_with_default_kernels_names_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATEN_", "MKL_CBWR"))}
    env.update(
        NLLAB_HOME=str(tmp_path),
        NLLAB_CPU_NUMERICS="native",
        ATEN_CPU_CAPABILITY="default",
        PYTHONPATH=str(ROOT),
    )
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 1, out.stderr
    assert "the native CPU numerics: torch's DEFAULT kernels and MKL" in out.stderr
    assert "data of" not in out.stderr  # the data sets are as pinned in either mode
