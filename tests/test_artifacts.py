"""Prefect artifacts for people: tables published with the console's numbers (4 significant
digits, not 17), ``nllab artifacts`` prints them without starting a server, and a database a run
keeps busy is read again, then named in one line (no traceback)."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing

import pytest

from flows.cli import main
from flows.runtime import _artifacts
from flows.runtime._artifacts import (
    ArtifactsBusy,
    artifacts_from_database,
    prefect_database,
    publish_table,
    read_artifacts,
)

KEY = "nllab-benchmark-artifactstest-results"
ROWS = [{"method": "node", "n_seeds": 2, "mean": 0.12345678901234568, "std": float("nan")}]
SHOWN = [{"method": "node", "n_seeds": 2, "mean": "0.1235", "std": "–"}]


@pytest.fixture
def published(prefect_server):
    from prefect import flow

    @flow
    def publish() -> None:
        publish_table(KEY, ROWS, "a made-up benchmark's results")

    publish()
    return KEY


def test_artifact_tables_read_as_the_console_prints_them(published, capsys):
    found, where = read_artifacts(published)
    assert found[0].key == KEY and found[0].data == SHOWN and "server" in where
    # the same artifact straight from the server's sqlite file (Prefect's own schema)
    assert artifacts_from_database(prefect_database(), KEY)[0].data == SHOWN

    assert main(["artifacts", "--key", KEY]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{KEY} (table, ") and "a made-up benchmark's results" in out
    assert "0.1235" in out and "0.123456" not in out
    assert main(["artifacts", "--all"]) == 0
    assert any(line.startswith(f"{KEY}  table  ") for line in capsys.readouterr().out.splitlines())
    assert main(["artifacts", "--key", "nllab-nothing-here"]) == 2


def test_a_busy_database_is_read_again_then_said_in_one_line(
    published, tmp_path, monkeypatch, capsys
):
    from prefect.settings import (
        PREFECT_API_DATABASE_CONNECTION_URL,
        PREFECT_API_URL,
        temporary_settings,
    )

    copy = tmp_path / "prefect.db"  # the server's database, as a run's temporary server keeps it
    with closing(sqlite3.connect(prefect_database())) as src, closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)
    writer = sqlite3.connect(copy, isolation_level=None, check_same_thread=False)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA locking_mode = EXCLUSIVE")  # a writer holding it: readers wait
    writer.execute("BEGIN EXCLUSIVE")
    monkeypatch.setattr(_artifacts, "BUSY_WAITS", (0.05, 0.05))
    with pytest.raises(ArtifactsBusy):
        artifacts_from_database(copy, KEY)

    local = {PREFECT_API_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{copy}"}
    with temporary_settings(updates=local, restore_defaults={PREFECT_API_URL}):
        assert main(["artifacts"]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert f"the Prefect database {copy} is busy (a run is writing to it)" in err

        # the writer lets go while the command waits: it reads (the last wait is a minute, so
        # that a loaded machine running the writer's timer late does not leave it busy to the
        # end; the command reads at its next try after the commit, seconds in)
        monkeypatch.setattr(_artifacts, "BUSY_WAITS", (0.5, 2.0, 60.0))
        threading.Timer(0.2, lambda: (writer.execute("COMMIT"), writer.close())).start()
        assert main(["artifacts", "--key", KEY]) == 0
    out = capsys.readouterr().out
    assert "0.1235" in out and f"read from {copy}" in out


def _artifacts_database(path, rows) -> None:
    """A Prefect database holding one benchmark results table (the columns that are read)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE artifact (key, type, created, description, data)")
        db.execute(
            "INSERT INTO artifact VALUES (?, 'table', '2026-11-28 10:00:00', 'results', ?)",
            ("nllab-benchmark-quick-results", json.dumps(json.dumps(rows))),
        )
        db.commit()


def test_artifacts_are_read_keyed_by_system_and_method_without_loading_prefect(tmp_path):
    """The default database is found without Prefect's settings (seconds to load); a table too
    wide for the terminal repeats the system and the method in each block; a profile that
    points Prefect at another database is still obeyed."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    wide = {f"column_{i}": "0.1234" for i in range(12)}
    _artifacts_database(
        tmp_path / "prefect" / "prefect.db",
        [{"method": m, "system": s, **wide} for m in ("node", "anode") for s in ("sine", "square")],
    )
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "NLLAB_HOME": str(tmp_path)}
    cmd = [sys.executable, "-X", "importtime", "-m", "flows.cli", "artifacts"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert loaded and not loaded & {"prefect", "pandas"}
    blocks = [b for b in r.stdout.split("\n\n") if "column_" in b]
    assert len(blocks) > 1
    for block in blocks:
        assert block.splitlines()[-6].split()[:2] == ["method", "system"], block
        assert [line.split()[:2] for line in block.splitlines()[-4:]] == [
            ["node", "sine"],
            ["node", "square"],
            ["anode", "sine"],
            ["anode", "square"],
        ]

    elsewhere = tmp_path / "elsewhere.db"
    _artifacts_database(elsewhere, [{"method": "node", "system": "sine", "mean": "0.5"}])
    (tmp_path / "prefect" / "profiles.toml").write_text(
        'active = "mine"\n[profiles.mine]\n'
        f'PREFECT_API_DATABASE_CONNECTION_URL = "sqlite+aiosqlite:///{elsewhere}"\n'
    )
    r = subprocess.run(
        cmd[:1] + cmd[3:], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and f"read from {elsewhere}" in r.stdout, r.stdout + r.stderr
