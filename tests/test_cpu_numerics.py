"""Bytes that must not depend on the CPU: pinned digests of each main system's quick data (every
machine, either CPU numerics mode) and of a short float64 training of each model (the portable
mode, any x86-64 CPU with AVX2 and FMA, Intel or AMD); the portable mode pins torch's kernel set
and computes matrix products and elementary functions with the platform's own kernels, so no
MKL code (which differs by CPU vendor) runs; a child whose MKL believes it runs on an AMD CPU
gets the same bytes.

A digest that differs names its component: a CPU (or a library build) that computes other bytes
fails here, not in a table's last digits. ``benchmarks/cpu_numerics.py`` shows which setting moves
which component."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from datasets import simulate
from nlmodels import _cpu
from nlmodels import numerics as _numerics
from nlmodels.accel import native as _native
from nlmodels.accel.native import _store
from nltrain.numerics import (
    PINNED,
    PINNED_SETTINGS,
    model_settings,
    pinned_label,
    pinned_model,
    training_digest,
)
from tasks import MAIN_SYSTEMS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "cpu_numerics.py"

#: The pins (nltrain.numerics.PINNED, also what ``nllab doctor`` checks): the quick data of each
# main
#: system and a short float64 training of each model in the portable mode.
QUICK_DATA = PINNED["data"]
TRAINING = PINNED["training"]
TWINS = PINNED["training_twins"]


def _model(label: str) -> tuple[str, dict, int]:
    return pinned_model(label)


def test_pinned_names_cover_every_main_system_and_model():
    from nlmodels import MODELS

    assert set(QUICK_DATA) == set(MAIN_SYSTEMS)
    assert set(MODELS) >= {_model(label)[0] for label in TRAINING}
    assert set(PINNED_SETTINGS) <= set(TRAINING)
    for label, (method, settings, dim) in PINNED_SETTINGS.items():
        assert pinned_label(method, model_settings(method, settings), dim) == label


def test_every_model_the_paper_profile_and_its_ablations_build_is_pinned():
    """Not a list to keep: the models as the ledger's cells build them (the paper profile's
    settings and each ablation's), read from the profile."""
    from tasks.ledger.scope import ledger_cell_configs
    from tasks.machine.numerics import model_key

    built = {
        pinned_label(c.method, model_settings(c.method, c.model), model_key(c)[2])
        for c, _ in ledger_cell_configs(seeds=[0])
    }
    assert built - set(TRAINING) == set()
    assert {label for label in built if label.startswith("neural_laplace")} <= set(TWINS)


@pytest.mark.parametrize("system", MAIN_SYSTEMS)
def test_quick_data_bytes_are_pinned(system):
    x = simulate(system, n_trajectories=200, seed=0, workers=1).x
    got = hashlib.sha256(x.tobytes()).hexdigest()[:16]
    assert got == QUICK_DATA[system], f"data of {system}: {got}, pinned {QUICK_DATA[system]}"


def _portable_or_skip() -> None:
    mode = _numerics.cpu_mode_in_effect()
    if not mode.startswith("portable"):
        pytest.skip(f"training digests are pinned for the portable mode; this process: {mode}")


@pytest.mark.parametrize("label", sorted(TRAINING))
def test_short_training_bytes_are_pinned(label):
    _portable_or_skip()
    method, settings, dim = _model(label)
    if method == "neural_laplace" and not _native.native_enabled():
        pinned = TWINS[label]  # no C compiler: the torch twins run
    else:
        pinned = TRAINING[label]
    got = training_digest(method, settings, dim)
    assert got == pinned, f"training of {label}: {got}, pinned {pinned}"


@pytest.mark.parametrize("label", sorted(TWINS))
def test_neural_laplace_twins_bytes_are_pinned(monkeypatch, label):
    _portable_or_skip()
    monkeypatch.setenv("NLLAB_NATIVE", "0")
    _native._forget()
    try:
        got = training_digest(*_model(label))
    finally:
        monkeypatch.undo()
        _native._forget()
    assert got == TWINS[label], f"training of {label} (torch twins): {got}"


def test_native_kernels_target_and_cache_key_follow_the_mode(monkeypatch, tmp_path):
    monkeypatch.delenv("NLLAB_NATIVE_MARCH", raising=False)
    monkeypatch.setenv(_cpu.MODE_VARIABLE, "native")
    native_flags, native_lib = _store.flags(), _store.target(tmp_path)
    assert native_flags[0] == "-march=native" and "-ffp-contract=off" not in native_flags
    monkeypatch.setenv(_cpu.MODE_VARIABLE, "portable")
    if not _cpu.portable():
        pytest.skip("the portable mode needs an x86-64 CPU with AVX2 and FMA")
    portable_flags = _store.flags()
    assert portable_flags[0] == f"-march={_cpu.PORTABLE_MARCH}"
    assert "-ffp-contract=off" in portable_flags
    assert not any(f.startswith("-mprefer-vector-width") for f in portable_flags)
    assert _store.target(tmp_path) != native_lib  # one cached build per target


#: What a child must not inherit: the modes under test, and this session's store and server.
_NOT_INHERITED = (
    *_numerics.PORTABLE_ENV,
    _cpu.MODE_VARIABLE,
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
    if not _cpu.portable_cpu():
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
    if not _cpu.portable_cpu():
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
    out = _child("-m", "flows.cli", "systems", NLLAB_CPU_NUMERICS="bogus")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "nllab systems: error: NLLAB_CPU_NUMERICS must be one of portable, native; got 'bogus'"
    ]


@pytest.mark.slow
def test_smoke_benchmark_bits_whatever_aten_cpu_capability(tmp_path):
    """The user's view: ``nllab benchmark --profile smoke`` (three models on the spiral) with
    ``ATEN_CPU_CAPABILITY=default`` and ``=avx2`` in the environment stores test RMSEs with the
    same bits in the default mode."""
    import sqlite3

    if not _cpu.portable_cpu():
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


def _load_script():
    spec = importlib.util.spec_from_file_location("cpu_numerics_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_bytes_do_not_depend_on_mkls_cpu_vendor_dispatch(tmp_path):
    """The portable mode's promise on CPUs of another vendor, shown on this one: a child whose MKL
    is told it runs on an AMD CPU (Zen: MKL then ignores MKL_CBWR and runs code of its own) trains
    to the pinned bytes, and MKL logs no call at all (``MKL_VERBOSE``): no BLAS, LAPACK or vector
    maths of MKL runs in training. (benchmarks/cpu_numerics.py shows that the same shim moves the
    bytes when torch's own kernels run.)"""
    if not _cpu.portable_cpu():
        pytest.skip("the portable mode needs an x86-64 CPU with AVX2 and FMA")
    try:
        shim = _load_script().mkl_amd_shim(tmp_path)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no C compiler for the MKL shim: {e}")
    methods = ("latent_ode", "node")
    out = _child(
        str(SCRIPT),
        "--child-training",
        *methods,
        LD_PRELOAD=str(shim),
        MKL_VERBOSE="1",
        NLLAB_HOME=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {m: TRAINING[m] for m in methods}
    calls = [line for line in out.stdout.splitlines() if line.startswith("MKL_VERBOSE ")]
    assert [line for line in calls if "oneMKL" not in line] == []


def test_importing_the_packages_changes_no_numerics_and_prints_nothing():
    """A library must not change its host process: the numerics are set up by entry points,
    and the orchestration libraries' settings by the modules that load them."""
    code = (
        "import os; before = dict(os.environ)\n"
        "import datasets, nlmodels, nltrain, tasks, flows\n"
        "print(os.environ.get('ATEN_CPU_CAPABILITY'))\n"
        "print(sorted(k for k in os.environ if os.environ.get(k) != before.get(k)))"
    )
    out = _child("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["None", "[]"]
    assert out.stderr == ""
