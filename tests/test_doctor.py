"""``nllab doctor``: every section reported, exit 0 when this machine computes the pinned bytes,
1 naming the component otherwise, and the verdict kept for the next runs' tags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import nltrain.numerics
from flows.cli import main
from nltrain.numerics import Mismatch, last_pinned_check

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
    monkeypatch.setattr(nltrain.numerics._pinned, "pinned_mismatches", lambda: list(mismatches))


def test_doctor_reports_every_section_and_exits_0_when_as_pinned(home, monkeypatch, capsys):
    _fake_check(monkeypatch, [])
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert [s for s in SECTIONS if f"\n{s}\n" in out] == list(SECTIONS)
    assert "✓ mode" in out and "portable (asked: portable)" in out
    assert "training of node" in out and out.strip().endswith("nllab doctor: all as pinned")
    assert last_pinned_check().verdict == "as pinned"


def test_doctor_names_what_differs_exits_1_and_tags_the_next_runs(home, monkeypatch, capsys):
    differs = [Mismatch("training", "node", "0" * 16, nltrain.numerics.PINNED["training"]["node"])]
    _fake_check(monkeypatch, differs)
    assert main(["doctor", "--fresh"]) == 1
    captured = capsys.readouterr()
    assert "✗ training of node" in captured.out
    assert "nllab doctor: 1 failed check, 1 problem:" in captured.err
    assert "computes other bytes: training of node\n" in captured.err
    # kept in the home: read back without computing, as a cell's run tags read it
    monkeypatch.setattr(
        nltrain.numerics._pinned, "pinned_mismatches", lambda: pytest.fail("recomputed")
    )
    assert last_pinned_check().verdict == "differs: training of node"
    assert main(["doctor"]) == 1  # warm: the kept check, no recomputation


def test_another_numerics_mode_says_its_cause_once_with_the_checks_it_explains(
    home, monkeypatch, capsys
):
    """In the native mode every training digest differs for one reason: said once on stderr
    with the checks it explains; the mode is not marked as pinned, and nothing unset is listed
    as pinned."""
    import nlmodels
    from nlmodels import NumericsSetup

    native = NumericsSetup(asked="native", mode="native", capability="AVX512", kernels="torch")
    monkeypatch.setattr(nlmodels, "require_numerics", lambda: native)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    names = ("node", "anode", "latent_ode")
    _fake_check(
        monkeypatch,
        [Mismatch("training", n, "0" * 16, nltrain.numerics.PINNED["training"][n]) for n in names],
    )
    assert main(["doctor", "--fresh"]) == 1
    captured = capsys.readouterr()
    assert "! mode" in captured.out and "✓ mode" not in captured.out
    assert "ONEDNN_MAX_CPU_ISA=" not in captured.out
    err = captured.err.strip().splitlines()
    assert err[0] == "nllab doctor: 3 failed checks, 1 problem:", err
    assert len(err) == 2 and err[1].count("the native CPU numerics") == 1, err
    assert err[1].endswith(
        ": training of anode, training of latent_ode, training of node (3 checks)"
    )


def test_problems_of_one_cause_are_one_line_and_the_others_one_each():
    from tasks.machine.doctor import Finding, problem_lines

    found = [
        Finding("s", "a", "differs (1, pinned 2)", "fail", "torch 9 computes other bytes"),
        Finding("s", "home", "not writable", "fail"),
        Finding("s", "ok", "fine", "ok", "never said"),
        Finding("s", "b", "differs (3, pinned 4)", "fail", "torch 9 computes other bytes"),
        Finding("s", "c", "differs (5, pinned 6)", "fail", "numpy 3 computes other bytes"),
    ]
    assert problem_lines(found) == [
        "torch 9 computes other bytes: a, b (2 checks)",
        "home: not writable",
        "numpy 3 computes other bytes: c",
    ]


def test_a_dependency_missing_from_the_environment_is_named_with_its_modules(tmp_path, monkeypatch):
    from tasks.machine.doctor import check_installation

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
    assert out.stderr.count("the native CPU numerics (torch's DEFAULT kernels and MKL)") == 1
    assert "data of" not in out.stderr  # the data sets are as pinned in either mode
    assert "✓ mode" not in out.stdout and "ONEDNN_MAX_CPU_ISA=\n" not in out.stdout
