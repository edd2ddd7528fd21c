"""An sqlite store that cannot be written says why in one line, each cause its own: busy (and
which process holds it), read-only (nothing to move), damaged (move it aside), a path longer
than sqlite opens; real sqlite errors classified, and a benchmark against a held store."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.tracking.sqlite_faults import MAX_SQLITE_PATH, sqlite_problem

ROOT = Path(__file__).resolve().parent.parent

# Holds a write lock (BEGIN IMMEDIATE) on the database, as a process stopped inside a write does.
_HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _store(path: Path) -> Path:
    with sqlite3.connect(path) as db:
        db.execute("create table runs (id integer)")
    return path


def _hold(path: Path, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "held"
    return p


def _write_error(path: Path, uri: str | None = None) -> str:
    db = sqlite3.connect(uri or str(path), uri=uri is not None, timeout=0.1)
    try:
        db.execute("insert into runs values (1)")
        db.commit()
    except sqlite3.Error as e:
        return f"(sqlite3.OperationalError) {e}"
    finally:
        db.close()
    raise AssertionError("the write succeeded")


def test_a_busy_store_names_the_process_that_holds_it(tmp_path):
    path = _store(tmp_path / "mlflow.db")
    holder = _hold(path, 30)
    try:
        line = sqlite_problem(_write_error(path), path)
    finally:
        holder.kill()
        holder.wait()
    assert line.startswith(f"the MLflow store {path} is busy (held by pid {holder.pid} (")
    assert "nothing was lost" in line and "\n" not in line


def test_read_only_and_damaged_stores_get_their_own_lines(tmp_path):
    path = _store(tmp_path / "mlflow.db")
    ro = sqlite_problem(_write_error(path, f"file:{path}?mode=ro"), path)
    assert "is read-only" in ro and "nothing needs to move" in ro and "mv " not in ro
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"not a database at all" * 100)
    damaged = sqlite_problem(_write_error(broken), broken)
    assert "is damaged" in damaged and f"mv {broken} {broken}.broken" in damaged
    full = sqlite_problem("(sqlite3.OperationalError) database or disk is full", path)
    assert "is full" in full
    assert sqlite_problem("some other error", path) is None


def test_an_immutable_store_is_read_only_not_damaged(tmp_path):
    path = _store(tmp_path / "mlflow.db")
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode:
        pytest.skip("no immutable flag here (chattr needs root and a file system that has it)")
    try:
        line = sqlite_problem(_write_error(path), path)
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    assert "is read-only" in line and "lsattr" in line


def _cli(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NLLAB_HOME": str(home)}
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT", "PREFECT_HOME", "PREFECT_API_URL"):
        env.pop(var, None)
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_home_too_deep_for_sqlite_is_said_at_once(tmp_path):
    home = tmp_path.joinpath(*["d" * 60] * (MAX_SQLITE_PATH // 60 + 1))
    t0 = time.perf_counter()
    out = _cli(home, "benchmark", "--profile", "smoke", "--methods", "node")
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"sqlite opens at most {MAX_SQLITE_PATH}" in out.stderr
    assert "Traceback" not in out.stderr and time.perf_counter() - t0 < 60


@pytest.mark.slow
def test_a_benchmark_against_a_held_store_is_one_line_and_exit_3(tmp_path):
    home = tmp_path / "home"
    code = "from tasks.tracking import connect; connect()"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NLLAB_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    holder = _hold(home / "mlflow" / "mlflow.db", 240)
    try:
        out = _cli(home, "benchmark", "--profile", "smoke", "--methods", "node", "--no-progress")
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode == 3, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    errors = [x for x in out.stderr.splitlines() if x.startswith("nllab benchmark: error:")]
    assert len(errors) == 1 and f"is busy (held by pid {holder.pid}" in errors[0]
    assert len((out.stdout + out.stderr).splitlines()) < 15


@pytest.mark.heavy  # waits out Prefect's start timeout
def test_a_missed_prefect_start_is_one_line_naming_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "1")
    out = _cli(tmp_path / "home", "benchmark", "--profile", "smoke", "--methods", "node")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if "error:" in x]
    assert "Prefect's temporary server did not start within 1 s" in line
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=SECONDS" in line


def test_the_prefect_start_timeout_grows_with_the_load(monkeypatch):
    from flows.runtime import prefect_server as ps

    monkeypatch.delenv(ps.TIMEOUT_VARIABLE, raising=False)
    monkeypatch.setattr(ps.os, "cpu_count", lambda: 2)
    for load, seconds in ((0.5, 90), (2.0, 90), (6.0, 90 + 60 * 2), (16.0, 90 + 60 * 7), (99, 600)):
        monkeypatch.setattr(ps.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert ps.startup_timeout() == seconds
    monkeypatch.setenv(ps.TIMEOUT_VARIABLE, "45")  # the user's value wins
    assert ps.startup_timeout() == 45


def test_an_immutable_store_folder_is_read_only_not_missing(tmp_path):
    """sqlite says "unable to open database file" when it cannot create its journal beside the
    store: the folder is there and searchable, so the cause said is a read-only folder."""
    path = _store(tmp_path / "mlflow.db")
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(tmp_path)]).returncode:
        pytest.skip("no immutable flag here (chattr needs root and a file system that has it)")
    try:
        line = sqlite_problem("(sqlite3.OperationalError) unable to open database file", path)
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path)], check=True)
    assert "is read-only" in line and f"lsattr -d {tmp_path}" in line, line
    missing = tmp_path / "gone" / "mlflow.db"
    line = sqlite_problem("(sqlite3.OperationalError) unable to open database file", missing)
    assert "its folder is missing or not searchable" in line


def test_a_store_with_a_damaged_page_is_refused_where_it_opens_in_one_unnested_line(
    tmp_path, monkeypatch, capsys
):
    """A page no query of the command would read is damaged (what PRAGMA integrity_check calls
    malformed): ``PRAGMA quick_check`` as the store opens refuses it, exit 3, one line that
    says "damaged" once."""
    from flows.cli import main
    from tasks.tracking import TrackingUnavailable, connect

    home = tmp_path / "home"
    monkeypatch.setenv("NLLAB_HOME", str(home))
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT"):
        monkeypatch.delenv(var, raising=False)
    connect()
    db = home / "mlflow" / "mlflow.db"
    with sqlite3.connect(db) as con:
        (root,) = con.execute(
            "select rootpage from sqlite_master where name = 'trace_info'"
        ).fetchone()
        (size,) = con.execute("pragma page_size").fetchone()
    with open(db, "r+b") as fh:  # a table the commands never read: only a full check sees it
        fh.seek((root - 1) * size)
        fh.write(b"\x99" * size)
    monkeypatch.setattr("tasks.tracking._connect._CONNECTED", {})  # a new process, as it were
    with pytest.raises(TrackingUnavailable, match="is damaged"):
        connect()
    assert main(["compare"]) == 3
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.count("is damaged (") == 1, err
    assert f"mv {db} {db}.broken" in err and "malformed" in err
