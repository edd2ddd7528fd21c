"""Bad inputs stop early with a message naming the problem, never with a traceback."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.config import ConfigError, resolve_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_non_finite_noise_and_learning_rate_are_refused(tmp_path, value):
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"[data]\nnoise_std = {value}\n[training]\nlr = {value}\n")
    with pytest.raises(ConfigError) as err:
        resolve_config("smoke", cfg, {})
    assert "data.noise_std: Input should be a finite number" in str(err.value)
    assert "training.lr: Input should be a finite number" in str(err.value)


def test_a_data_set_too_large_for_memory_fails_with_an_estimate(tmp_path, monkeypatch):
    import dataclasses

    import datasets._simulate as sim
    from datasets import simulate

    monkeypatch.setattr(sim, "available_memory", lambda: 4 * 2**30)
    cfg = tmp_path / "run.toml"
    cfg.write_text("[data]\nn_trajectories = 2e6\n")  # TOML float, accepted as an integer
    with pytest.raises(ConfigError, match=r"integro_de: n_trajectories=2000000 × 200 points"):
        resolve_config("smoke", cfg, {"systems": ["integro_de"]})

    # Refused before any simulation: the system's generator fails the test if it is called
    # (rather than a bound on the seconds, which a loaded machine can exceed).
    def never(*args):
        pytest.fail("the data set was simulated before its memory was checked")

    spec = sim.SYSTEM_SPECS["integro_de"]
    monkeypatch.setitem(sim.SYSTEM_SPECS, "integro_de", dataclasses.replace(spec, generate=never))
    # integro_de is 1-D: 2e6 × 200 × 1 × 8 bytes × 6 arrays
    with pytest.raises(ValueError, match=r"about 17\.9 GiB .* 4\.0 GiB is available"):
        simulate("integro_de", n_trajectories=2_000_000)
    # what fits still passes
    resolve_config("smoke", None, {"systems": ["integro_de"], "data": {"n_trajectories": 1000}})


def test_a_bad_model_uri_fails_before_prefect_starts(monkeypatch, mlflow_store):
    import flows.reproduce as rep

    def no_prefect():
        raise AssertionError("Prefect was started for a URI that does not exist")

    monkeypatch.setattr(rep, "flow_settings", no_prefect)
    with pytest.raises(LookupError, match="no registered model version at 'models:/nope@champion'"):
        rep.reproduce("models:/nope@champion")
    with pytest.raises(LookupError, match="names no version"):
        rep.reproduce("models:/nope")


def test_stale_temporary_cache_files_are_removed_and_nothing_else(tmp_path):
    from datasets import load_or_simulate
    from datasets._cache import STALE_TMP_SECONDS

    fp = "0123456789abcdef" * 2
    stale = tmp_path / f".integro_de-{fp}-k2j4h_a9.tmp"
    live = tmp_path / f".lotka_volterra_dde-{fp}-zz9q0xwe.tmp"
    user = tmp_path / ".my-notes.tmp"
    for p in (stale, live, user):
        p.write_bytes(b"partial")
    old = time.time() - STALE_TMP_SECONDS - 60
    os.utime(stale, (old, old))
    os.utime(user, (old, old))
    load_or_simulate("integro_de", n_trajectories=10, n_points=8, cache_dir=tmp_path)
    assert not stale.exists()
    assert live.exists() and user.exists()
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp" and p not in (live, user)]


#: What points a command at a store or server other than its home's own.
_ELSEWHERE = ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT", "PREFECT_API_URL")


def _cli(home: Path, *args: str, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NLLAB_HOME": str(home)}
    for var in (*_ELSEWHERE, "PREFECT_HOME"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "flows.cli", *args]
    return subprocess.run(
        (wrap or []) + cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def _read_only(folder: Path) -> list[str] | None:
    """A command prefix that runs its command with ``folder`` read-only, or ``None``."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return []
    if shutil.which("unshare") is None:
        return None
    # root ignores permissions: a read-only bind mount in a private mount namespace instead
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        return None
    script = f'mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && exec "$@"'
    return ["unshare", "-rm", "sh", "-c", script, "sh"]


@pytest.mark.parametrize("command", [["benchmark", "--methods", "node"]])
def test_a_read_only_home_fails_fast_with_a_message(tmp_path, command):
    home = tmp_path / "home"
    home.mkdir()
    wrap = _read_only(home)
    if wrap is None:
        pytest.skip("cannot make a read-only folder here")
    t0 = time.perf_counter()
    out = _cli(home, *command, "--profile", "smoke", "--systems", "integro_de", wrap=wrap)
    seconds = time.perf_counter() - t0
    home.chmod(0o755)
    assert out.returncode == 3, out.stdout + out.stderr  # the environment
    assert "Traceback" not in out.stderr
    assert f"the data folder '{home}' is not writable" in out.stderr
    assert "set NLLAB_HOME to a writable folder" in out.stderr
    assert seconds < 120
    assert not any(home.iterdir())


@pytest.mark.heavy  # every check of doctor in a process
def test_doctor_reports_a_read_only_home_as_a_failed_check(tmp_path):
    """doctor runs in a home it cannot write and says so among its findings: exit 1, as a
    failed check, not the refusal (3) of a command that would write there."""
    home = tmp_path / "home"
    home.mkdir()
    wrap = _read_only(home)
    if wrap is None:
        pytest.skip("cannot make a read-only folder here")
    out = _cli(home, "doctor", wrap=wrap)
    home.chmod(0o755)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "not writable" in out.stdout


def test_a_home_that_is_a_file_fails_with_a_message(tmp_path):
    (tmp_path / "file").write_text("")
    out = _cli(tmp_path / "file" / "home", "simulate", "--profile", "smoke")
    assert out.returncode == 3, out.stdout + out.stderr  # the environment
    assert "Traceback" not in out.stderr and "is not writable (Not a directory)" in out.stderr


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://", "sqlite:///:memory:", "MISSING"])
def test_a_storage_that_would_lose_the_study_or_make_a_folder_is_refused(tmp_path, url):
    missing = tmp_path / "no" / "such"
    url = f"sqlite:///{missing / 'x.db'}" if url == "MISSING" else url
    args = ["--method", "node", "--system", "integro_de", "--trials", "1", "--storage", url]
    out = _cli(tmp_path / "home", "tune", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    if "MISSING" in url or "no/such" in url:
        assert f"the folder '{missing}'" in out.stderr and "does not exist" in out.stderr
        assert not (tmp_path / "no").exists()
    else:
        assert "is in memory: the study would be lost" in out.stderr


def test_a_config_that_is_a_directory_says_so(tmp_path):
    out = _cli(tmp_path / "home", "benchmark", "--config", str(tmp_path), "--profile", "smoke")
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"config file '{tmp_path}' is a directory, not a file" in out.stderr


def test_open_storage_refuses_what_the_command_line_refuses(tmp_path):
    from tasks.tuning import TuningError, open_storage

    for url in ("sqlite:///", f"sqlite:///{tmp_path / 'no' / 'x.db'}"):
        with pytest.raises(TuningError):
            open_storage(url)
    assert not (tmp_path / "no").exists()
    open_storage(f"sqlite:///{tmp_path / 'x.db'}").engine.dispose()  # a named folder: fine
    assert (tmp_path / "x.db").is_file()


@pytest.mark.parametrize(
    ("setting", "expected", "in_a_process"),
    [
        ("--epochs 99999999999999999999", "training.epochs: Input should be less than or equal", 0),
        ("[training]\nepochs = 1e20", "training.epochs:", 0),
        ("[training]\nepochs = 1000000000000", "less than or equal to 1000000", 0),
        ("[models.node]\nhidden = [100000000, 100000000]", "layer widths must be at most 65536", 0),
        # one as a user runs it, in a process of its own (the rest: the same main, in this one)
        ("[models.node]\nhidden = [65536, 65536, 65536, 65536]", "GB to train;", 1),
    ],
)
def test_absurd_sizes_are_refused_when_the_config_is_read(
    tmp_path, setting, expected, in_a_process, monkeypatch, capfd
):
    config = tmp_path / "c.toml"
    args = ["benchmark", "--config", str(config), "--methods", "node", "--systems", "integro_de"]
    if setting.startswith("--"):
        args += setting.split()
        setting = ""
    config.write_text(f'profile = "smoke"\n{setting}\n')
    home = tmp_path / "home"
    if in_a_process:
        out = _cli(home, *args)
        code, err = out.returncode, out.stderr
    else:
        from flows.cli import main

        monkeypatch.setenv("NLLAB_HOME", str(home))
        for var in _ELSEWHERE:
            monkeypatch.delenv(var, raising=False)
        try:
            code = main(args)
        except SystemExit as e:  # argparse's own refusals
            code = e.code
        err = capfd.readouterr().err
    assert code == 2, err
    assert expected in err and "Traceback" not in err
    assert not (home / "mlflow").exists()  # refused before anything started
    if "GB" in expected:  # "this model needs N GB to train; M GB free"
        assert re.search(r"this model needs [\d,.]+ GB to train; [\d,.]+ GB free", err)


@pytest.mark.parametrize("out", ["/proc/self/nllab-report", "READ-ONLY"])
def test_report_out_in_a_place_that_cannot_be_written_is_one_line(tmp_path, out):
    wrap = None
    if out == "READ-ONLY":
        (tmp_path / "ro").mkdir()
        wrap, out = _read_only(tmp_path / "ro"), str(tmp_path / "ro" / "report")
        if wrap is None:
            pytest.skip("cannot make a read-only folder here")
    out_ = _cli(tmp_path / "home", "report", "--out", out, wrap=wrap)
    assert out_.returncode == 2, out_.stdout + out_.stderr
    assert "Traceback" not in out_.stderr and "is not writable; name another folder" in out_.stderr


@pytest.mark.parametrize("method", ["node", "anode", "neural_laplace", "nf_coupling"])
def test_the_memory_estimate_counts_the_real_models_parameters(method):
    from nlmodels import build_model
    from tasks.machine.model_memory import TRAINING_COPIES, training_bytes

    real = sum(p.numel() for p in build_model(method, 3).parameters())  # allocated for real
    assert training_bytes(method, 3, {}, "float64") == real * 8 * TRAINING_COPIES
    assert training_bytes(method, 3, {}, "float32") == real * 4 * TRAINING_COPIES


def _every_setting() -> list[tuple[str, str]]:
    """Each setting of a run's data, training and execution, read from the types themselves
    (a setting added later is in it)."""
    from nltrain import TrainConfig
    from tasks.config import DataConfig, ExecutionConfig

    return [
        (section, name)
        for section, kind in (("data", DataConfig), ("training", TrainConfig))
        for name in kind.model_fields
        if name != "source"  # a declared system's file, tested with the data files
    ] + [("execution", name) for name in ExecutionConfig.model_fields]


#: Values no setting was written for: below, at and far past any bound, not finite, of
#: another type.
_ABSURD = (-1, 0, 10**12, math.nan, math.inf, -1.5, "bogus", [1], True)


@pytest.mark.parametrize(("section", "name"), _every_setting())
def test_any_value_of_any_setting_is_refused_by_name_or_works(section, name, tmp_path):
    """A value is refused when the config is read, naming its setting, or what the cell does
    with it works: its data simulate and split, its threads are set. Never a config that
    passes and then fails in the cell."""
    import torch

    from tasks.machine.workers import worker_threads
    from tasks.pipeline import prepare_cell, simulate_data

    for value in _ABSURD:
        layer = {name: value} if section == "execution" else {section: {name: value}}
        try:
            config = resolve_config("smoke", None, {"systems": ["integro_de"], **layer})
        except ConfigError as e:
            # the setting is named (a count n_x perhaps by its noun: "× 10¹² points")
            assert name in str(e) or f" {name.removeprefix('n_')}" in str(e), (value, str(e))
            continue
        for cell in config.cells()[:1]:
            prepare_cell(cell, simulate_data(cell.system, cell.data, cell.seed, tmp_path))
        before = torch.get_num_threads()
        ex = config.execution
        try:
            torch.set_num_threads(worker_threads(ex.torch_threads, ex.max_workers))
        finally:
            torch.set_num_threads(before)


def _every_model_option() -> list[tuple[str, str]]:
    """Each option of each built-in model, read from its constructor's annotations."""
    from nlmodels.model_registry import model_option_types
    from tasks.config import BUILTIN_METHODS

    return [(m, name) for m in BUILTIN_METHODS for name in model_option_types(m)]


@pytest.mark.parametrize(("method", "name"), _every_model_option())
def test_any_value_of_any_model_option_is_refused_before_the_run_or_builds(
    method, name, monkeypatch
):
    """A model option's value is refused when the config is read or when the benchmark checks
    its models (both before anything starts, each naming the option), or the model builds: a
    constructor's refusal is never first met in a cell."""
    import torch

    import tasks.machine.model_memory as memory
    from nlmodels import build_model
    from tasks.errors import SettingError

    monkeypatch.setattr(memory, "free_bytes", lambda device: 2**28)  # build only small ones
    for value in _ABSURD:
        overrides = {"systems": ["integro_de"], "methods": [method], "models": {method: {}}}
        overrides["models"][method][name] = value
        try:
            cell = resolve_config("smoke", None, overrides).cells()[0]
            memory.check_models_fit([cell], "cpu")
        except ConfigError as e:
            assert name in str(e), (value, str(e))
            continue
        except memory.ModelTooLarge:
            continue
        except SettingError as e:
            assert name in str(e) and method in str(e), (value, str(e))
            continue
        model = build_model(method, 1, **cell.model).double()
        t = torch.linspace(0.0, 1.0, 8, dtype=torch.float64)
        with torch.no_grad():
            out = model(t[:4], torch.zeros(2, 4, 1, dtype=torch.float64), t[4:])
        assert out.shape == (2, 4, 1), (value, out.shape)


@pytest.mark.parametrize("profile", ["smoke", "quick", "paper"])
def test_every_model_a_shipped_profile_trains_is_accepted_by_its_constructor(profile):
    """What lets a schedule that changes no model option skip building its models."""
    from tasks.config import SYSTEM_NAMES
    from tasks.machine.model_memory import check_models_build

    check_models_build(resolve_config(profile, None, {"systems": list(SYSTEM_NAMES)}).cells())


def test_every_model_refuses_an_empty_query_grid_in_one_line():
    """No time to predict at is a ValueError naming query_t for every registered model (the
    fused decoder once divided by the number of times instead)."""
    import torch

    from nlmodels import build_model
    from nlmodels.model_registry import model_names

    t = torch.linspace(0.1, 1.0, 5, dtype=torch.float64)
    x = torch.randn(3, 5, 2, dtype=torch.float64)
    for method in model_names():
        model = build_model(method, 2).double()
        with pytest.raises(ValueError, match="query_t"):
            model(t, x, t[:0])
