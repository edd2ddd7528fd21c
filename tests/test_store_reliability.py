"""The embedded MLflow store under races and kills, stale RUNNING runs, and cell claims.

Every process of the platform opens the store with ``tasks.tracking.connect`` first; these
tests start real processes on one fresh ``$NLLAB_HOME`` as two commands started at once would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Says it is ready (mlflow imported), waits for the start file (so all processes hit store
# creation together), then connects.
_CONNECT = """
import os, sys, time
from pathlib import Path
from tasks.tracking import connect
print("ready", flush=True)
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.01)
t = connect()
print("connected", t.experiment_id, flush=True)
"""


def _env(home: Path, install: Path | None = None) -> dict[str, str]:
    """A process on ``home`` (and the installation cache ``install``, else the tests')."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NLLAB_HOME": str(home)}
    if install is not None:
        env["NLLAB_INSTALL_CACHE"] = str(install)
    for var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT", "PREFECT_API_URL"):
        env.pop(var, None)
    return env


def _store_ok(home: Path) -> None:
    """The store opens, has the experiment and takes a run (checked in a fresh process)."""
    code = (
        "from tasks.tracking import connect\n"
        "t = connect()\n"
        "with t.runs.run('probe', {'nllab.kind': 'probe'}) as r:\n"
        "    t.runs.log_metrics(r, {'x': 1.0})\n"
        "print('ok', len(t.store.client.search_runs([t.experiment_id])))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(home), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


@pytest.mark.heavy  # processes racing to create one store
def test_processes_creating_a_fresh_store_at_once_all_succeed(tmp_path):
    home = tmp_path / "home"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONNECT, str(go)],
            env=_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    # every process at the start line, mlflow imported
    assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 3
    go.touch()
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n---\n".join(outs)
    assert len({o.split()[-1] for o in outs}) == 1  # one experiment, the same for all
    _store_ok(home)
    assert not list((home / "mlflow").glob(".*.tmp"))


def test_a_fresh_store_is_an_ordinary_sqlite_file_and_later_connections_sync(point_mlflow_at):
    """The schema is built without sqlite's syncs (on a scratch file); the store that takes its
    name keeps the default journal, and no connection opened afterwards skips a sync."""
    import contextlib
    import sqlite3

    import sqlalchemy

    from tasks.tracking import connect

    folder = point_mlflow_at(Path(os.environ["NLLAB_HOME"]) / "fresh-store")
    connect()
    with contextlib.closing(sqlite3.connect(folder / "mlflow.db")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert db.execute("select count(*) from alembic_version").fetchone() == (1,)
    for name in ("mlflow.db", "other.db"):
        engine = sqlalchemy.create_engine(f"sqlite:///{folder / name}")
        with engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        engine.dispose()
    assert not list(folder.glob(".*.tmp"))


def test_a_new_store_is_this_mlflows_template_with_its_own_default_experiment(
    tmp_path, monkeypatch, point_mlflow_at
):
    """The first store is built by MLflow's migrations and kept, without its experiments, as
    the template of the next ones: those are copies that MLflow accepts as its own schema, each
    with a Default experiment at its own artifact root. A damaged template, or one of another
    MLflow's schema, is built again; where no template can be kept, every store is built."""
    import contextlib
    import sqlite3

    import mlflow.store.db.utils as db_utils

    from tasks.tracking import connect

    monkeypatch.setenv("NLLAB_INSTALL_CACHE", str(tmp_path / "install"))
    monkeypatch.setenv("NLLAB_HOME", str(tmp_path / "home"))
    built = []
    migrate = db_utils._initialize_tables
    monkeypatch.setattr(db_utils, "_initialize_tables", lambda e: built.append(1) or migrate(e))

    def rows(db_file: Path, sql: str) -> list[tuple]:
        with contextlib.closing(sqlite3.connect(db_file)) as db:
            return db.execute(sql).fetchall()

    def new_store(name: str) -> Path:
        folder = point_mlflow_at(tmp_path / name)
        tracker = connect()
        with tracker.runs.run("probe", {"nllab.kind": "probe"}) as run:  # a working store
            tracker.runs.log_metrics(run, {"x": 1.0})
        default = "select experiment_id, name, artifact_location from experiments where name = ?"
        with contextlib.closing(sqlite3.connect(folder / "mlflow.db")) as db:
            found = db.execute(default, ("Default",)).fetchall()
        assert found == [(0, "Default", str(folder / "artifacts" / "0"))]
        return folder / "mlflow.db"

    tables = "select name from sqlite_master where type = 'table' order by name"
    head = "select version_num from alembic_version"
    first = new_store("first")
    (template,) = (tmp_path / "install").glob("mlflow-schema/*.db")
    assert len(built) == 1
    assert rows(template, "select count(*) from experiments") == [(0,)]
    assert rows(template, head) == rows(first, head)
    assert rows(template, tables) == rows(first, tables)
    second = new_store("second")
    assert len(built) == 1  # a copy, not built again
    assert rows(second, tables) == rows(first, tables) and rows(second, head) == rows(first, head)

    template.write_bytes(b"not a database")
    killed, live = (template.with_name(f".{template.name}.{pid}.tmp") for pid in (1, 2))
    for part in (killed, live):
        part.write_bytes(b"a copy cut short")
    os.utime(killed, (time.time() - 3600,) * 2)
    new_store("after-damage")
    assert not killed.exists() and live.exists()  # a killed copy's leftover goes, a young one not
    live.unlink()
    assert len(built) == 2 and rows(template, head) == rows(first, head)  # kept again
    with contextlib.closing(sqlite3.connect(template)) as db, db:
        db.execute("update alembic_version set version_num = 'another-mlflows'")
    assert rows(new_store("after-another-mlflow"), head) == rows(first, head)
    assert len(built) == 3 and rows(template, head) == rows(first, head)

    template.unlink()
    monkeypatch.setenv("NLLAB_INSTALL_CACHE", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("")
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "home" / "mlflow-schema").write_text("")  # nowhere to keep a template
    new_store("uncached")
    assert len(built) == 4 and not (tmp_path / "home" / "mlflow-schema").is_dir()
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.slow
def test_kill_while_the_store_is_created_leaves_a_usable_store(tmp_path):
    home = tmp_path / "home"
    go = tmp_path / "go"
    go.touch()
    # no schema template: the store is built by migrations, the long creation to kill
    env = _env(home, tmp_path / "install")
    proc = subprocess.Popen([sys.executable, "-c", _CONNECT, str(go)], env=env)
    folder = home / "mlflow"
    deadline = time.monotonic() + 120
    # kill -9 as soon as the database file (or its build copy) appears: mid-creation.
    while not (folder.is_dir() and any(p.name != "mlflow.db.lock" for p in folder.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(0.2)
    proc.kill()
    proc.wait()
    _store_ok(home)
    assert not list(folder.glob(".*.tmp"))  # the killed build copy was cleared


def test_a_damaged_store_says_what_to_do_without_a_traceback(tmp_path):
    home = tmp_path / "home"
    (home / "mlflow").mkdir(parents=True)
    db = home / "mlflow" / "mlflow.db"
    db.write_bytes(b"this is not a database" * 100)
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "report", "--profile", "smoke"],
        env=_env(home),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert f"mv {db} {db}.broken" in out.stderr
    assert db.read_bytes().startswith(b"this is not")  # never deleted by the platform


def test_read_only_home_fails_fast_with_a_message(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes to read-only folders")
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    try:
        from tasks.config import TrackingConfig
        from tasks.tracking import TrackingUnavailable, connect

        uri = f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
        with pytest.raises(TrackingUnavailable, match=r"not writable.*NLLAB_HOME"):
            connect(TrackingConfig(tracking_uri=uri))
    finally:
        home.chmod(0o755)


# -- stale RUNNING runs ---------------------------------------------------------------------

_ORPHAN = """
import os
from tasks.tracking import connect
t = connect()
rid = t.runs.create_run("orphan", {"nllab.kind": "cell"})
print(rid, flush=True)
os.kill(os.getpid(), 9)
"""


def test_runs_of_a_killed_process_end_killed_on_the_next_connect(mlflow_store):
    from tasks.tracking import connect

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _ORPHAN], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == -signal.SIGKILL, out.stderr
    orphan = out.stdout.split()[0]
    # A run of this (live) process must survive the cleanup.
    live = connect().runs.create_run("live", {"nllab.kind": "cell"})
    tracker = connect()
    assert tracker.queries.get_run_data(orphan).status == "KILLED"
    assert "ended without closing" in tracker.queries.get_run_data(orphan).tags["error"]
    assert tracker.queries.get_run_data(live).status == "RUNNING"
    assert tracker.claims.end_stale_runs() == []
    tracker.runs.end_run(live, "FINISHED")


def test_cell_runs_of_another_host_end_killed_once_their_claim_is_stale_or_taken_over(
    mlflow_store,
):
    """Another host's processes cannot be asked, so their cell runs are judged by the claims."""
    from tasks.tracking import connect

    tracker = connect()

    def run_of(host: str, token: str, kind: str = "cell", config_hash: str | None = None) -> str:
        tags = {"nllab.kind": kind} | ({"config_hash": config_hash} if config_hash else {})
        run_id = tracker.runs.create_run(f"{kind}-{token}", tags)
        tracker.runs.set_tags(run_id, {"nllab.host": host, "nllab.process": token})
        return run_id

    beating = run_of("host-b", "11:1", config_hash="a1" * 32)
    assert tracker.claims.claim_cell("a1" * 32, "host-b/11:1/x")
    silent = run_of("host-b", "12:1", config_hash="b2" * 32)
    assert tracker.claims.claim_cell("b2" * 32, "host-b/12:1/y")
    tracker.claims._beat("b2" * 32, 0, repr(time.time() - 100))  # last heartbeat 100 s ago
    moved = run_of("host-b", "13:1", config_hash="c3" * 32)
    time.sleep(0.05)
    assert tracker.claims.claim_cell("c3" * 32, "host-c/14:1/z")  # taken by another host since
    assert tracker.claims.claim_cell("d4" * 32, "host-c/15:1/w")
    time.sleep(0.05)
    unclaimed = run_of("host-b", "16:1", config_hash="d4" * 32)  # never claimed this cell
    parent = run_of("host-b", "17:1", kind="benchmark")

    assert sorted(tracker.claims.end_stale_runs(stale_after=50)) == sorted([silent, moved])
    status = {r: tracker.queries.get_run_data(r).status for r in (beating, unclaimed, parent)}
    assert set(status.values()) == {"RUNNING"}, status
    assert "ended without closing" in tracker.queries.get_run_data(moved).tags["error"]
    for run_id in (beating, unclaimed, parent):
        tracker.runs.end_run(run_id, "FINISHED")


# -- cell claims -----------------------------------------------------------------------------

H = "ab" * 32


def test_a_cell_claim_has_one_holder_until_released(mlflow_store):
    from tasks.tracking import claim_owner, connect

    tracker = connect()
    a, b = claim_owner(), claim_owner()
    assert a != b
    assert tracker.claims.claim_cell(H, a)
    assert not tracker.claims.claim_cell(H, b)
    assert tracker.claims.claim_cell(H, a)  # the holder may claim again
    assert tracker.claims.heartbeat_cell(H, a) and not tracker.claims.heartbeat_cell(H, b)
    assert tracker.claims.claim_cell("cd" * 32, b)  # another cell is free
    tracker.claims.release_cell(H, b)  # not the holder: no effect
    assert not tracker.claims.claim_cell(H, b)
    tracker.claims.release_cell(H, a)
    assert tracker.claims.claim_cell(H, b)
    assert not tracker.claims.claim_cell(H, a) and not tracker.claims.heartbeat_cell(H, a)


def test_a_stale_claim_is_taken_over_and_its_old_holder_learns_it(mlflow_store):
    from tasks.tracking import connect

    # Staleness is judged against the caller's ``stale_after``: a claim of any age is stale for
    # 0 s and fresh for an hour, so the outcome never depends on how loaded the machine is.
    tracker = connect()
    fresh, stale = 3600.0, 0.0
    assert tracker.claims.claim_cell(H, "owner-a", stale_after=fresh)
    assert not tracker.claims.claim_cell(H, "owner-b", stale_after=fresh)
    assert tracker.claims.claim_cell(H, "owner-b", stale_after=stale)
    assert not tracker.claims.heartbeat_cell(H, "owner-a")
    assert not tracker.claims.claim_cell(H, "owner-a", stale_after=fresh)


def test_a_heartbeat_keeps_a_claim_from_going_stale(mlflow_store):
    from tasks.tracking import connect

    tracker = connect()
    # The claim's last beat is dated an hour back (stale for ten minutes' stale_after), and the
    # beating thread must renew it: staleness is judged against minutes, not against seconds of
    # sleep that a loaded machine could stall the thread for (as the stale-claim test does).
    with tracker.claims.cell_claim(H, "owner-a", stale_after=600.0, interval=0.05) as mine:
        assert mine
        hour_ago = time.time() - 3600
        tracker.claims._beat(H, tracker.claims.claim_generation(H, "owner-a"), repr(hour_ago))
        deadline = time.monotonic() + 60
        while tracker.claims._claim_state(H).beat < hour_ago + 1800:  # until it beats again
            assert time.monotonic() < deadline, "the claim's heartbeat stopped"
            time.sleep(0.05)
        assert not tracker.claims.claim_cell(H, "owner-b", stale_after=600.0)
    assert tracker.claims.claim_cell(H, "owner-b", stale_after=600.0)  # released at the end


@pytest.mark.heavy  # a claiming process killed
def test_the_claim_of_a_dead_process_of_this_host_is_taken_over_at_once(mlflow_store):
    from tasks.tracking import connect

    code = (
        "import os\nfrom tasks.tracking import connect, claim_owner\n"
        f"assert connect().claims.claim_cell({H!r}, claim_owner())\nos.kill(os.getpid(), 9)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], env=env, timeout=120, check=False)
    tracker = connect()
    assert tracker.claims.claim_holder(H) is not None  # the dead process did claim it
    assert tracker.claims.claim_cell(H, "owner-b")  # long before the default stale_after


def test_owners_claiming_at_once_get_exactly_one_winner(mlflow_store):
    from tasks.tracking import connect

    connect()
    for cell in range(3):
        h = f"{cell:064x}"
        start = threading.Barrier(4)
        wins: list[str] = []

        def claim(owner: str, h: str, start: threading.Barrier, wins: list[str]) -> None:
            start.wait()
            if connect().claims.claim_cell(h, owner):
                wins.append(owner)

        threads = [threading.Thread(target=claim, args=(f"o{i}", h, start, wins)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1, wins


def _claims_runs(t) -> list[str]:
    exp = t.claims._bookkeeping_experiment()
    return [
        r.info.run_id for r in t.store.client.search_runs([exp], "tags.`nllab.kind` = 'claims'")
    ]


def test_one_claims_run_per_experiment_without_a_store_lock(mlflow_store, monkeypatch):
    """As against a tracking server (no file lock): threads of one process, and a process that
    raced another one's creation, leave one claims run."""
    import contextlib

    from tasks.tracking import CellClaims, Store, connect

    monkeypatch.setattr(Store, "lock", lambda self: contextlib.nullcontext())
    first = connect()
    trackers = [CellClaims(Store(first.store.settings, first.experiment_id)) for _ in range(6)]
    go = threading.Barrier(len(trackers))

    def claims_run(t):
        go.wait()
        return t._claims_run()

    threads_ids = []
    workers = [
        threading.Thread(target=lambda t=t: threads_ids.append(claims_run(t))) for t in trackers
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(set(threads_ids)) == 1 and _claims_runs(first) == threads_ids[:1]

    # Another process's search ran before this one's run existed: both created one.
    late = CellClaims(Store(first.store.settings, first.experiment_id))
    search, calls = late._client.search_runs, []

    def racing_search(*args, **kw):
        calls.append(1)
        return [] if len(calls) <= 2 else search(*args, **kw)

    monkeypatch.setattr(late._client, "search_runs", racing_search)
    assert late._claims_run() == threads_ids[0]  # the oldest
    assert _claims_runs(first) == threads_ids[:1]  # its own one deleted
