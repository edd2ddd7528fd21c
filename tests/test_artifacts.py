"""Prefect artifacts for people: tables published with the console's numbers (4 significant
digits, not 17), ``nllab artifacts`` prints them without starting a server, and a database a run
keeps busy is read again, then named in one line (no traceback)."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing

import pytest

from flows import _artifacts
from flows._artifacts import (
    ArtifactsBusy,
    artifacts_from_database,
    prefect_database,
    publish_table,
    read_artifacts,
)
from flows.cli import main

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

        # the writer lets go while the command waits: it reads
        monkeypatch.setattr(_artifacts, "BUSY_WAITS", (0.5, 2.0))
        threading.Timer(0.2, lambda: (writer.execute("COMMIT"), writer.close())).start()
        assert main(["artifacts", "--key", KEY]) == 0
    out = capsys.readouterr().out
    assert "0.1235" in out and f"read from {copy}" in out
