"""Bytes that must not depend on the CPU: pinned digests of each main system's quick data (every
machine, either CPU numerics mode) and of a short float64 training of each model (the portable
mode, any x86-64 CPU with AVX2 and FMA); the portable mode pins torch's kernel set itself.

A digest that differs names its component: a CPU (or a library build) that computes other bytes
fails here, not in a table's last digits. ``benchmarks/cpu_numerics.py`` shows which setting moves
which component."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from datasets import simulate
from nlmodels import _numerics
from nlmodels.accel import native as _native
from nlmodels.accel.native import _store
from tasks._names import MAIN_SYSTEMS
from tasks.numerics import training_digest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "cpu_numerics.py"

#: sha256(simulate(system, n_trajectories=200, seed=0).x)[:16]: the quick profile's data. Equal
#: on an AVX-512 EPYC and on an AVX2-only EPYC (numpy 2.4, scipy's LSODA, glibc's libm).
QUICK_DATA = {
    "spiral_dde": "7661b9870a07b19d",
    "lotka_volterra_dde": "7acc7d7f93792003",
    "mackey_glass_dde": "b5b852ee3dd35871",
    "stiff_van_der_pol": "5f941977f04c1794",
    "piecewise_forcing_ode": "ad8e494091640ee7",
    "integro_de": "c8494c357eb58022",
}
#: tasks.numerics.training_digest in the portable mode, torch 2.13 CPU; Neural Laplace with the
#: native kernels and with their torch twins (NLLAB_NATIVE=0).
TRAINING = {
    "anode": "6cdc0437377b37bf",
    "latent_ode": "9c458f70a8c5a37c",
    "neural_laplace": "6554829ae1865a80",
    "nf_coupling": "4f4c7c411330bec9",
    "nf_resnet": "5f8a5718137d7e0c",
    "node": "e60e1ccff8b1023f",
}
NEURAL_LAPLACE_TWINS = "703cedd0b705cadd"


def test_pinned_names_cover_every_main_system_and_model():
    from nlmodels import MODELS

    assert set(QUICK_DATA) == set(MAIN_SYSTEMS)
    assert set(TRAINING) <= set(MODELS)


@pytest.mark.parametrize("system", MAIN_SYSTEMS)
def test_quick_data_bytes_are_pinned(system):
    x = simulate(system, n_trajectories=200, seed=0, workers=1).x
    got = hashlib.sha256(x.tobytes()).hexdigest()[:16]
    assert got == QUICK_DATA[system], f"data of {system}: {got}, pinned {QUICK_DATA[system]}"


def _portable_or_skip() -> None:
    mode = _numerics.cpu_mode_in_effect()
    if not mode.startswith("portable"):
        pytest.skip(f"training digests are pinned for the portable mode; this process: {mode}")


@pytest.mark.parametrize("method", sorted(TRAINING))
def test_short_training_bytes_are_pinned(method):
    _portable_or_skip()
    if method == "neural_laplace" and not _native.native_enabled():
        pinned = NEURAL_LAPLACE_TWINS  # no C compiler: the torch twins run
    else:
        pinned = TRAINING[method]
    got = training_digest(method)
    assert got == pinned, f"training of {method}: {got}, pinned {pinned}"


def test_neural_laplace_twins_bytes_are_pinned(monkeypatch):
    _portable_or_skip()
    monkeypatch.setenv("NLLAB_NATIVE", "0")
    _native._forget()
    try:
        got = training_digest("neural_laplace")
    finally:
        monkeypatch.undo()
        _native._forget()
    assert got == NEURAL_LAPLACE_TWINS, f"training of neural_laplace (torch twins): {got}"


def test_native_kernels_target_and_cache_key_follow_the_mode(monkeypatch, tmp_path):
    monkeypatch.delenv("NLLAB_NATIVE_MARCH", raising=False)
    monkeypatch.setenv(_numerics.MODE_VARIABLE, "native")
    native_flags, native_lib = _store.flags(), _store.target(tmp_path)
    assert native_flags[0] == "-march=native" and "-ffp-contract=off" not in native_flags
    monkeypatch.setenv(_numerics.MODE_VARIABLE, "portable")
    if not _numerics.portable():
        pytest.skip("the portable mode needs an x86-64 CPU with AVX2 and FMA")
    portable_flags = _store.flags()
    assert portable_flags[0] == f"-march={_numerics.PORTABLE_MARCH}"
    assert "-ffp-contract=off" in portable_flags
    assert not any(f.startswith("-mprefer-vector-width") for f in portable_flags)
    assert _store.target(tmp_path) != native_lib  # one cached build per target


#: What a child must not inherit: the modes under test, and this session's store and server.
_NOT_INHERITED = (
    *_numerics.PORTABLE_ENV,
    _numerics.MODE_VARIABLE,
    "MLFLOW_TRACKING_URI",
    "NLLAB_ARTIFACT_ROOT",
    "PREFECT_HOME",
    "PREFECT_API_URL",
)


def _child(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    clean.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, *args], env=clean, cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_default_mode_gives_the_same_bits_whatever_aten_cpu_capability(tmp_path):
    """Smoke-sized training (the smoke profile's data size, epochs and batch) of Neural Laplace,
    the Latent ODE (GRU) and the NODE in two processes whose environment asks for different
    torch kernel sets: the default mode pins its own, says once that it replaced the user's
    value, and the test RMSE and forecasts have the same bits."""
    if not _numerics._portable_cpu():
        pytest.skip("the portable mode needs an x86-64 CPU with AVX2 and FMA")
    runs = {}
    for capability in ("default", "avx2"):
        out = _child(
            str(SCRIPT), "--child-smoke", ATEN_CPU_CAPABILITY=capability, NLLAB_HOME=str(tmp_path)
        )
        assert out.returncode == 0, out.stderr[-2000:]
        runs[capability] = json.loads(out.stdout.strip().splitlines()[-1])
        notes = [line for line in out.stderr.splitlines() if "portable CPU numerics" in line]
        replaced = capability != _numerics.PORTABLE_ENV["ATEN_CPU_CAPABILITY"]
        assert len(notes) == replaced, out.stderr  # said once, only when it replaced a value
    assert runs["default"] == runs["avx2"]


@pytest.mark.slow
def test_native_mode_keeps_the_users_capability_and_its_bits_differ(tmp_path):
    """The other side: ``NLLAB_CPU_NUMERICS=native`` keeps the user's kernel set, whose bits
    differ (so the test above could fail), and an unknown mode is one line, then portable."""
    if not _numerics._portable_cpu():
        pytest.skip("the portable mode needs an x86-64 CPU with AVX2 and FMA")
    bits = {}
    for mode in ("native", "portable"):
        out = _child(
            str(SCRIPT),
            "--child-smoke",
            ATEN_CPU_CAPABILITY="default",
            NLLAB_CPU_NUMERICS=mode,
            NLLAB_HOME=str(tmp_path),
        )
        assert out.returncode == 0, out.stderr[-2000:]
        bits[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    assert bits["native"] != bits["portable"]
    code = "import nlmodels, torch; print(torch.backends.cpu.get_cpu_capability())"
    out = _child("-c", code, NLLAB_CPU_NUMERICS="bogus", ATEN_CPU_CAPABILITY="default")
    assert out.stdout.strip() == "AVX2", out.stderr
    assert "NLLAB_CPU_NUMERICS must be one of portable, native; got 'bogus'" in out.stderr


@pytest.mark.slow
def test_smoke_benchmark_bits_whatever_aten_cpu_capability(tmp_path):
    """The user's view: ``nllab benchmark --profile smoke`` (three models on the spiral) with
    ``ATEN_CPU_CAPABILITY=default`` and ``=avx2`` in the environment stores test RMSEs with the
    same bits in the default mode."""
    import sqlite3

    if not _numerics._portable_cpu():
        pytest.skip("the portable mode needs an x86-64 CPU with AVX2 and FMA")
    scores = {}
    for capability in ("default", "avx2"):
        home = tmp_path / capability
        env = {"ATEN_CPU_CAPABILITY": capability, "NLLAB_HOME": str(home)}
        args = ("--profile", "smoke", "--systems", "spiral_dde")
        methods = ("--methods", "neural_laplace,latent_ode,node")
        out = _child("-m", "flows.cli", "benchmark", *args, *methods, **env)
        assert out.returncode == 0, out.stderr[-3000:]
        with sqlite3.connect(home / "mlflow" / "mlflow.db") as db:
            rows = db.execute(
                "SELECT r.name, m.value FROM metrics m JOIN runs r ON m.run_uuid = r.run_uuid"
                " WHERE m.key = 'test_rmse'"
            ).fetchall()
        scores[capability] = {name: float(v).hex() for name, v in rows}
    assert len(scores["avx2"]) == 3
    assert scores["default"] == scores["avx2"]
