"""Faults of the environment and the smaller bad inputs of the command line: one line naming the
cause, the right exit code, no traceback on the terminal (the full one in a log file)."""

from __future__ import annotations

import socket
import sqlite3
import time
from collections import namedtuple
from pathlib import Path

import pytest

from flows.cli import main


def _refused_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "error" in ln.lower()]


SMOKE = ["--profile", "smoke", "--systems", "integro_de", "--methods", "node", "--no-progress"]


def test_a_full_disk_mid_benchmark_is_one_line_exit_3_and_a_log(
    tmp_path, monkeypatch, mlflow_store, prefect_server, capfd
):
    import sqlalchemy.exc
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    home = tmp_path / "home"
    monkeypatch.setenv("NLLAB_HOME", str(home))
    writes = []

    def full(self, *args, **kwargs):  # every write after the parent run is created
        writes.append(args)
        error = sqlite3.OperationalError("database or disk is full")
        raise sqlalchemy.exc.OperationalError("INSERT INTO params", {}, error)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", full)
    capfd.readouterr()
    assert main(["benchmark", *SMOKE]) == 3
    out, err = capfd.readouterr()
    assert writes, "the fault was never reached"
    assert "Traceback" not in out + err, err[-3000:]
    (line,) = _errors(err)
    assert f"the disk of '{home}' is full" in line and "run the same command again" in line
    log = Path(line.rsplit("(details: ", 1)[1].rstrip(")"))
    assert log.parent == home / "logs" and log.stat().st_mode & 0o777 == 0o600
    assert "database or disk is full" in log.read_text() and "Traceback" in log.read_text()


def test_the_log_of_a_full_disk_is_written_in_the_home_by_freeing_its_reserve(
    tmp_path, monkeypatch
):
    import errno
    import os

    from flows.runtime import faults

    faults.reserve_log_space(tmp_path)
    reserve = tmp_path / "logs" / ".reserve"
    assert reserve.stat().st_size == faults.LOG_RESERVE_BYTES
    real_open = os.open

    def full_disk(path, flags, mode=0o777, **kw):  # no room until the reserve is freed
        if str(path).endswith(".log") and reserve.exists():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(faults.os, "open", full_disk)
    log = faults.write_log("benchmark", RuntimeError("database or disk is full"), tmp_path)
    assert log is not None and log.parent == tmp_path / "logs", log
    assert log.stat().st_mode & 0o777 == 0o600 and not reserve.exists()
    assert "RuntimeError: database or disk is full" in log.read_text()


def test_an_os_level_disk_full_is_recognised_anywhere_in_the_chain(tmp_path):
    import errno

    from flows.runtime.faults import describe_fault

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "f"))
        except OSError as e:
            raise RuntimeError("saving the model failed") from e
    except RuntimeError as e:
        assert f"the disk of '{tmp_path}' is full" in describe_fault(e, tmp_path)
    assert describe_fault(ValueError("a plain bug"), tmp_path) is None


def test_too_little_free_space_refuses_to_start(tmp_path, monkeypatch, capfd):
    import flows.runtime.faults as faults

    home = tmp_path / "home"
    monkeypatch.setenv("NLLAB_HOME", str(home))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(faults.shutil, "disk_usage", lambda _: usage(10**9, 10**9, 2_400_000))
    # no home is made, so the log goes to the temporary folder: this test's, not the machine's
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(faults.tempfile, "tempdir", str(scratch))
    assert main(["simulate", "--profile", "smoke", "--systems", "integro_de"]) == 3
    (line,) = _errors(capfd.readouterr().err)
    assert f"only 2.3 MB free on the disk of '{home}' (at least 50 MB needed" in line
    assert not (home / "mlflow").exists()
    (log,) = scratch.glob("nllab-simulate-*.log")
    assert "EnvironmentFault: only 2.3 MB free" in log.read_text()


def test_dask_address_implies_dask_and_an_unreachable_scheduler_fails_in_seconds(
    tmp_path, monkeypatch, capfd
):
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    address = f"tcp://127.0.0.1:{_refused_port()}"
    t0 = time.perf_counter()
    assert main(["benchmark", *SMOKE, "--dask-address", address]) == 3
    assert time.perf_counter() - t0 < 20
    (line,) = _errors(capfd.readouterr().err)
    assert f"no Dask scheduler answers at {address}" in line
    assert main(["benchmark", *SMOKE, "--task-runner", "thread", "--dask-address", address]) == 2
    assert "--dask-address implies --task-runner dask" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["tune", "--method", "node", "--system", "integro_de", "--trials", "1",
          "--storage", "notaurl"], 2, "the Optuna storage 'notaurl' is not an SQLAlchemy URL"),
        (["benchmark", *SMOKE, "--tuned", "--storage", "notaurl"], 2,
         "the Optuna storage 'notaurl' is not an SQLAlchemy URL"),
        (["benchmark", *SMOKE, "--seeds", "99999999999999999999"], 2,
         "--seeds takes non-negative integers up to 4294967295"),
    ],
)  # fmt: skip
def test_bad_command_line_values_are_one_line(tmp_path, monkeypatch, capfd, args, code, message):
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    assert main(args) == code
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    (line,) = _errors(err)
    assert message in line


def test_tune_trials_zero_is_a_usage_line(capfd):
    with pytest.raises(SystemExit) as e:
        main(["tune", "--method", "node", "--system", "integro_de", "--trials", "0"])
    assert e.value.code == 2
    err = capfd.readouterr().err
    assert "argument --trials: a whole number of at least 1, got '0'" in err
    assert "pydantic" not in err and "validation error" not in err


def test_a_too_long_experiment_name_is_a_config_error(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NLLAB_EXPERIMENT", "x" * 501)
    assert main(["report", "--profile", "smoke"]) == 2
    (line,) = _errors(capfd.readouterr().err)
    assert "NLLAB_EXPERIMENT is 501 characters long" in line and "mlflow.db" not in line
    assert not (tmp_path / "home" / "mlflow").exists()


def test_report_out_naming_a_file_is_one_line(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    (tmp_path / "afile").write_text("mine")
    for out in (tmp_path / "afile", tmp_path / "afile" / "reports"):
        assert main(["report", "--out", str(out)]) == 2
        (line,) = _errors(capfd.readouterr().err)
        assert f"--out '{out}'" in line and "names the folder" in line
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_lost_tracking_server_is_named_and_a_plain_error_is_not(monkeypatch, tmp_path):
    from mlflow.exceptions import MlflowException

    from flows.runtime.faults import describe_fault, fault_in_text

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    lost = MlflowException(
        "API request to endpoint /api/2.0/mlflow/runs/log-batch failed with exception "
        "HTTPConnectionPool(host='127.0.0.1', port=5999): Max retries exceeded with url: ... "
        "(Caused by NewConnectionError(... [Errno 111] Connection refused))"
    )
    line = describe_fault(lost, tmp_path)
    assert line.startswith("the MLflow tracking server http://127.0.0.1:5999 stopped answering")
    assert fault_in_text(f"MlflowException: {lost}", tmp_path) == line  # a failed cell's error
    assert fault_in_text("ValueError: latent_dim must be positive", tmp_path) is None
    # a refused connection to something else is not blamed on the tracking server
    assert describe_fault(ConnectionRefusedError(111, "Connection refused"), tmp_path) is None


@pytest.mark.parametrize(
    "args",
    [
        ["tune", "--method", "node", "--system", "integro_de", "--trials", "1"],
        ["study", "noise", "--profile", "smoke", "--systems", "integro_de"],
    ],
)
def test_tune_and_study_refuse_a_dead_tracking_server_before_starting(
    tmp_path, monkeypatch, capfd, args
):
    import flows.studies
    import flows.tune

    home = tmp_path / "home"
    monkeypatch.setenv("NLLAB_HOME", str(home))
    uri = f"http://127.0.0.1:{_refused_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    def started(*args, **kwargs):
        pytest.fail("the run started (Prefect, MLflow's retries) before the server was checked")

    # Refused before the study or tuning run starts, by construction: not a bound on seconds
    # that the first command's imports alone took 9 of at load 8 on 2 cores.
    monkeypatch.setattr(flows.tune, "run_tune", started)
    monkeypatch.setattr(flows.studies, "run_study", started)
    assert main(args) == 3
    (line,) = _errors(capfd.readouterr().err)
    assert f"the MLflow tracking server {uri} does not answer" in line
    assert not (home / "optuna").exists()  # no empty study left behind
