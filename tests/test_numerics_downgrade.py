"""No silent downgrade: when the default (portable) CPU numerics cannot be had (no C compiler,
no writable kernel cache, a failed self-test), a command says so in its first line, with what it
means for the bytes and the fix; the cell runs' tags say so; ``nllab doctor`` fails; and a
read-only kernel cache falls back to a folder of the home before the kernels are given up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from cells import tiny_cell

import nlmodels
from flows.cli import main
from nlmodels import NumericsSetup, numerics
from nlmodels.accel import native as _native
from nlmodels.accel.native import _store
from nltrain import EpochRecord, TrainResult
from tasks.pipeline import CellSetup, build_cell_model, evaluate_cell, prepare_cell, simulate_data
from tasks.tracking import RunTags

ROOT = Path(__file__).resolve().parents[1]

#: The numerics a fresh process sets up, as JSON (the self-test replaced by ``argv[1]`` if given).
_PROBE = """
import json, sys
from pathlib import Path
import nlmodels
from nlmodels.accel.native import _store
if len(sys.argv) > 1:
    _store.SELF_TEST_SCRIPT = Path(sys.argv[1])
    _store._FLAGS = ("-O0", *_store._FLAGS[1:])
setup = nlmodels.set_up_numerics()
print(json.dumps({"mode": setup.mode, "reason": setup.reason,
                  "line": nlmodels.numerics_downgrade()}))
"""


def _fresh(tmp_path: Path, **env: str) -> dict[str, str]:
    """The environment of a process with empty kernel caches and its own home."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("NLLAB_")}
    return {
        **base,
        "NLLAB_HOME": str(tmp_path / "home"),
        "NLLAB_NATIVE_CACHE": str(tmp_path / "cache"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "PYTHONPATH": str(ROOT),
        **env,
    }


def _probe(env: dict[str, str], *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def _says_the_downgrade(line: str, fix: str) -> None:
    assert "\n" not in line
    assert "not the portable ones asked for" in line
    assert "will not match the pinned ones" in line and f"Fix: {fix}" in line


@pytest.mark.parametrize(
    "no_compiler", [{"CC": "/nonexistent"}, {"PATH": "/nonexistent"}], ids=["CC", "PATH"]
)
def test_without_a_compiler_the_lost_portable_mode_is_said_with_its_fix(tmp_path, no_compiler):
    env = _fresh(tmp_path, **no_compiler)
    if "PATH" in no_compiler:
        env.pop("CC", None)
    got = _probe(env)
    assert got["mode"] == "native" and "no C compiler" in got["reason"]
    _says_the_downgrade(got["line"], "install a C compiler")


def test_a_failed_self_test_is_said_with_its_fix(tmp_path):
    crash = tmp_path / "crash.py"
    crash.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    got = _probe(_fresh(tmp_path), str(crash))
    assert got["mode"] == "native" and "killed by SIGILL" in got["reason"]
    _says_the_downgrade(got["line"], "`nllab doctor` names the failing check")


def test_the_default_mode_says_nothing():
    assert nlmodels.require_numerics().mode == "portable"
    assert nlmodels.numerics_downgrade() == ""


def test_a_command_says_it_in_its_first_line_before_any_work(tmp_path):
    """A usage error is answered alone (no torch loads for it); a command that works says the
    lost portable mode in its first line, before any work."""
    config = tmp_path / "bad.toml"
    config.write_text("[training]\nepochs = -3\n")

    def nllab(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "flows.cli", "benchmark", *args],
            env=_fresh(tmp_path, CC="/nonexistent"),
            capture_output=True,
            text=True,
            timeout=600,
        )

    out = nllab("--config", str(config))
    assert out.returncode == 2
    (only,) = out.stderr.strip().splitlines()
    assert only.startswith("nllab benchmark: error: invalid configuration: training.epochs")
    # a run that works: its first line, read as it comes (the run is then stopped)
    argv = ["--profile", "smoke", "--systems", "integro_de", "--methods", "node"]
    with subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "benchmark", *argv],
        env=_fresh(tmp_path, CC="/nonexistent"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as run:
        assert run.stderr is not None
        first = run.stderr.readline().strip()
        run.kill()
    assert first.startswith("nllab benchmark: warning: the CPU numerics are native"), first
    _says_the_downgrade(first, "install a C compiler")


_LOST = NumericsSetup(
    asked="portable",
    mode="native",
    capability="AVX2",
    kernels="torch",
    reason="no native kernels for the portable mode (no C compiler 'cc' on PATH)",
    fix="install a C compiler (gcc or clang; CC names another one) and run again",
)


def test_a_cells_run_tags_say_so(monkeypatch):
    cell = tiny_cell()
    ds = simulate_data(cell.system, cell.data, cell.seed)
    prepared = prepare_cell(cell, ds)
    model, args = build_cell_model(cell, int(ds.x.shape[-1]))
    setup = CellSetup(cell, ds, prepared, model.to(getattr(torch, cell.training.dtype)), args)
    history = (EpochRecord(0, 1.0, 0.9, 0.8, 0.5, 10), EpochRecord(1, 0.7, 0.6, 0.55, 0.5, 10))
    trained = TrainResult(history, best_epoch=1, best_val_rmse=0.55, stopped="epochs", seconds=1.0)
    cpu = torch.device("cpu")
    assert RunTags.NUMERICS_DOWNGRADE not in evaluate_cell(setup, trained, cpu, "h").tags
    monkeypatch.setattr(numerics, "_setup", _LOST)
    tags = evaluate_cell(setup, trained, cpu, "h").tags
    assert "no C compiler" in tags[RunTags.NUMERICS_DOWNGRADE]
    assert tags[RunTags.CPU_NUMERICS] == "native (AVX2)"


def test_doctor_fails_naming_the_cause_and_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path))
    monkeypatch.setattr(nlmodels, "require_numerics", lambda: _LOST)
    monkeypatch.setattr("nltrain.numerics._pinned.pinned_mismatches", lambda: [])
    assert main(["doctor", "--fresh"]) == 1
    out = capsys.readouterr().out
    (mode,) = [line for line in out.splitlines() if " mode " in line]
    assert mode.lstrip().startswith("✗") and "no C compiler" in mode
    assert "install a C compiler" in mode


def _read_only(monkeypatch, *folders: Path) -> None:
    """``folders`` as a read-only file system has them (root writes past a chmod)."""
    real = tempfile.TemporaryFile

    def refuse(*args, **kw):
        if Path(kw.get("dir") or "") in folders:
            raise OSError(30, "Read-only file system")
        return real(*args, **kw)

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Empty configured, default and home kernel caches, and no library loaded."""
    configured, home = tmp_path / "cache", tmp_path / "home"
    monkeypatch.setenv("NLLAB_NATIVE_CACHE", str(configured))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("NLLAB_HOME", str(home))
    monkeypatch.setattr(_store, "_FLAGS", ("-O0", *_store._FLAGS[1:]))
    monkeypatch.setattr(_store, "_private_dir", None)
    for folder in (configured, tmp_path / "xdg" / "nllab" / "native"):
        folder.mkdir(parents=True, mode=0o700)
    _native._forget()
    yield configured, tmp_path / "xdg" / "nllab" / "native", home / "native"
    _native._forget()


def test_a_read_only_kernel_cache_falls_back_to_the_homes_folder(caches, monkeypatch):
    configured, default, home = caches
    _read_only(monkeypatch, configured, default)
    with pytest.warns(RuntimeWarning, match=r"cache.* is not writable \(Read-only file system\)"):
        assert _native.library() is not None
    assert list(home.glob("nlkernels-*.so")) and not list(configured.iterdir())


def test_with_the_home_read_only_too_a_private_folder_serves(caches, monkeypatch):
    configured, default, home = caches
    home.mkdir(parents=True, mode=0o700)
    _read_only(monkeypatch, configured, default, home)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert _store.cache_dir() not in (configured, default, home)
