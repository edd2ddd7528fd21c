"""Reliability probes, as a user would trigger them, on fresh homes under a scratch folder.

1. Two ``nllab report --profile smoke`` at once on a fresh ``$NLLAB_HOME``, ``--tries`` times:
   processes that crashed, stores left unusable.
2. Ctrl-C from a terminal: SIGINT to the process group of ``nllab benchmark --profile smoke``
   once its first training cell has finished: exit code, seconds to exit, cells left RUNNING,
   the temporary Prefect server gone; then the rerun's exit code and reused cells.
3. Bad inputs: exit code, seconds, tracebacks shown, the error's first line.
4. ``kill -9`` of ``nllab benchmark`` at chosen moments (``--kill-at`` seconds after it starts,
   from the store's creation to the registry), each on a fresh home, then the same command again:
   finished cells lost or trained twice, runs left RUNNING, processes left behind, unusable stores.
5. Two identical ``nllab benchmark`` commands on one fresh home, 3 s apart: exit codes, cells
   trained twice, tracebacks.
6. ``home``: ``cp -a`` of a home then a benchmark on the copy (files written into the original;
   the copy's champion reproduced after deleting the original); a FINISHED run's model deleted
   (trained again, said in one line); the champion's model missing, then its run deleted and
   purged (``reproduce``: one line, exit 2; a retrain replaces the alias).
7. ``suspend``: Ctrl-Z of a benchmark mid-cell past the claim's stale time, the same command
   meanwhile, then SIGCONT: cells trained twice, the waiting line, the resumed run fenced off.
8. ``worker``: kill -9, then SIGTERM, of one worker process (process isolation): only its cell
   fails, nothing stays RUNNING.
9. ``--only strict``: config values of the wrong kind or range (``hidden = "128"``,
   ``epochs = true``, ``solver = "eular"``, ...) and the smaller bad inputs (a 501-character
   ``NLLAB_EXPERIMENT``, ``report --out`` a file, ``tune --trials 0``, a seed past 32 bits, a
   malformed Optuna storage, ``--dask-address`` with no scheduler or with the thread runner):
   exit 2 (3 for the scheduler), one error line, no traceback.
10. ``--only tune-sigterm`` / ``tune-ctrl-c``: SIGTERM (SIGINT to the group) of ``nllab tune
   --trials 6`` mid-trial: exit 143 (130), no traceback, no trial left RUNNING, the parent run
   KILLED; then the same command at once: 6 finished trials, the parent FINISHED.
11. ``--only disk-full`` (root: a tmpfs home): 2.4 MB free at the start, the disk filling up
   mid-run: exit 3 with one line, no traceback; freed, the same command: nothing lost.
12. ``--only serve``: two ``nllab serve`` on one Prefect server: Ctrl-C of the first leaves the
   shared deployment unpaused; the server stopped, the second says so and exits 3.
13. ``--only diverged|storage|absurd|busy``: the third pass (``benchmarks/reliability_third.py``):
   a diverged model never registered, storage URLs that would lose a study, absurd sizes, a
   busy machine or a locked, read-only or too deep store.

    PYTHONPATH=. python benchmarks/reliability.py [--tries 4] [--scratch /tmp/nllab-probes]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from probe_common import ROOT, fresh_dir, one_clear_line, print_row, probe_env
from reliability_third import THIRD_PASS

from flows.runtime._prefect import guarded_servers

CELLS = [
    "--profile", "smoke", "--systems", "integro_de", "piecewise_forcing_ode",
    "--methods", "node", "neural_laplace", "nf_coupling", "--epochs", "40", "--max-workers", "1",
    "--no-progress",
]  # fmt: skip


def _nllab(home: Path, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=probe_env(home), text=True, **kw
    )


def race(scratch: Path, tries: int) -> None:
    crashed = unusable = 0
    for t in range(tries):
        home = fresh_dir(scratch / f"race-{t}")
        procs = [
            _nllab(home, "report", "--profile", "smoke", stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)
            for _ in range(2)
        ]  # fmt: skip
        errs = [p.communicate()[1] for p in procs]
        # An empty store has nothing to report: exit 1 with that message is the answer, not a crash.
        answered = [
            "Traceback" not in e and (p.returncode == 0 or "nothing to report" in e)
            for p, e in zip(procs, errs, strict=True)
        ]
        crashed += answered.count(False)  # any other exit, or exit 1 without that answer
        check = subprocess.run(
            [sys.executable, "-c", "from tasks.tracking import connect; connect()"],
            env=probe_env(home), capture_output=True,
        )  # fmt: skip
        unusable += check.returncode != 0
        print(f"  try {t + 1}: exit codes {[p.returncode for p in procs]}, "
              f"tracebacks {sum('Traceback' in e for e in errs)}", flush=True)  # fmt: skip
    print(f"concurrent reports: {crashed} of {2 * tries} processes crashed, "
          f"{unusable} of {tries} stores unusable")  # fmt: skip


def ctrl_c(scratch: Path) -> None:
    home = fresh_dir(scratch / "ctrl-c")
    cfg = home / "isolation.toml"
    cfg.write_text('isolation = "process"\n')
    p = _nllab(home, "benchmark", *CELLS, "--config", str(cfg), stdout=subprocess.PIPE,
               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    for line in p.stdout:
        if "Task run 'integro_de/" in line and "Completed()" in line:
            break
    servers = guarded_servers(p.pid)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    tail = p.communicate()[0]
    seconds = time.monotonic() - t0
    time.sleep(2)
    alive = [s for s in servers if Path(f"/proc/{s}").exists()]
    print(f"terminal Ctrl-C: exit {p.returncode} after {seconds:.1f} s; tracebacks "
          f"{tail.count('Traceback')}; Prefect servers alive 2 s later: {len(alive)}")  # fmt: skip
    runs = _store_runs(home)  # as the process left it (a client would end stale runs first)
    running = sum(status == "RUNNING" for _, status, _, _ in runs)
    kept = sum(map(len, _finished_cells(runs).values()))
    print(f"  runs left RUNNING: {running}; finished cells kept: {kept}")
    p = _nllab(home, "benchmark", *CELLS, "--config", str(cfg), stdout=subprocess.PIPE,
               stderr=subprocess.STDOUT)  # fmt: skip
    summary = [ln for ln in p.communicate()[0].splitlines() if " cells: " in ln]
    print(f"  rerun: exit {p.returncode}; {summary[-1] if summary else '?'}")


def _store_runs(home: Path) -> list[tuple[str, str, str | None, str | None]]:
    """``(run id, status, kind, config hash)`` of every run, read from the sqlite file itself
    (an MLflow client would end stale runs, or create a missing store, as it opened it)."""
    db = home / "mlflow" / "mlflow.db"
    if not db.exists():
        return []
    query = (
        "SELECT r.run_uuid, r.status, "
        "(SELECT value FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = 'nllab.kind'), "
        "(SELECT value FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = 'config_hash') "
        "FROM runs r WHERE r.lifecycle_stage = 'active'"
    )
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            return con.execute(query).fetchall()
    except sqlite3.Error:
        return []  # killed before its tables existed


def _finished_cells(runs) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for run_id, status, kind, config_hash in runs:
        if kind == "cell" and status == "FINISHED":
            out.setdefault(config_hash, []).append(run_id)
    return out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def kill9(scratch: Path, delays: list[float]) -> None:
    totals = dict(lost=0, twice=0, running=0, left=0, unusable=0)
    gone_after = 0.0
    print(f"kill -9 of nllab benchmark ({len(delays)} moments), then the same command again")
    for i, delay in enumerate(delays):
        home = fresh_dir(scratch / f"kill9-{i}")
        log = home / "killed.log"
        with open(log, "w") as out:
            p = _nllab(home, "benchmark", *CELLS, stdout=out, stderr=subprocess.STDOUT,
                       start_new_session=True)  # fmt: skip
            time.sleep(delay)
            servers = guarded_servers(p.pid)
            if p.poll() is None:
                p.kill()  # the main process only, as `kill -9 PID` does
            p.wait()
        before = _finished_cells(_store_runs(home))
        # What it started (the temporary Prefect server, worker processes) must go too: the
        # server's guard stops it gracefully and ends it for good 10 s after its parent died.
        killed_at, left = time.monotonic(), [1]
        while left and time.monotonic() - killed_at < 12:
            time.sleep(0.2)
            left = [s for s in servers if Path(f"/proc/{s}").exists()]
            left += [p.pid] if _group_alive(p.pid) else []
        gone_after = max(gone_after, time.monotonic() - killed_at)
        r = subprocess.run([sys.executable, "-m", "flows.cli", "benchmark", *CELLS], cwd=ROOT,
                           env=probe_env(home), capture_output=True, text=True)  # fmt: skip
        runs = _store_runs(home)
        after = _finished_cells(runs)
        # A cell finished before the kill is lost if its run is gone or it was trained again.
        lost = sum(set(after.get(h, [])) != set(ids) for h, ids in before.items())
        twice = sum(len(ids) > 1 for ids in after.values())
        running = sum(status == "RUNNING" for _, status, _, _ in runs)
        unusable = r.returncode != 0 or len(after) != 6
        last = (log.read_text().strip().splitlines() or ["(no output)"])[-1]
        print(f"  {delay:5.1f} s: {len(before)} cells finished before the kill; after the rerun "
              f"(exit {r.returncode}): lost {lost}, trained twice {twice}, RUNNING {running}, "
              f"processes left {len(left)} | {last[:50]}", flush=True)  # fmt: skip
        for key, value in zip(totals, (lost, twice, running, len(left), unusable), strict=True):
            totals[key] += int(value)
    print("kill -9: " + ", ".join(f"{k} {v}" for k, v in totals.items())
          + f"; its processes all gone within {gone_after:.1f} s")  # fmt: skip


def twins(scratch: Path) -> None:
    home = fresh_dir(scratch / "twins")
    procs = []
    for _ in range(2):
        procs.append(_nllab(home, "benchmark", *CELLS, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT))  # fmt: skip
        time.sleep(3)
    outs = [p.communicate()[0] for p in procs]
    runs = _store_runs(home)
    finished = _finished_cells(runs)
    trained = sum(map(len, finished.values()))
    summaries = [next((x for x in reversed(o.splitlines()) if " cells: " in x), "?") for o in outs]
    print(f"two identical benchmarks on one home: exit codes {[p.returncode for p in procs]}, "
          f"{trained} finished cell runs for {len(finished)} cells, "
          f"tracebacks {sum(o.count('Traceback') for o in outs)}")  # fmt: skip
    for line in summaries:
        print(f"  {line.strip()}")


def bad_inputs(scratch: Path) -> None:
    b = fresh_dir(scratch / "bad")
    (b / "noise.toml").write_text("[data]\nnoise_std = inf\n")
    (b / "lr.toml").write_text("[training]\nlr = inf\n")
    (b / "big.toml").write_text("[data]\nn_trajectories = 2e6\n")
    (b / "broken" / "mlflow").mkdir(parents=True)
    (b / "broken" / "mlflow" / "mlflow.db").write_bytes(os.urandom(5000))
    (b / "afile").write_text("")
    ro = fresh_dir(b / "ro")
    ro_wrap = [
        "unshare",
        "-rm",
        "sh",
        "-c",
        f'mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && exec "$@"',
        "sh",
    ]
    cases = [
        ("read-only home", ro, ro_wrap, ["benchmark", "--profile", "smoke"]),
        ("noise_std = inf", b / "h", [], ["benchmark", "--config", str(b / "noise.toml")]),
        ("lr = inf", b / "h", [], ["benchmark", "--config", str(b / "lr.toml")]),
        ("n_trajectories = 2e6", b / "h", [], ["benchmark", "--config", str(b / "big.toml")]),
        ("reproduce bad URI", b / "h", [], ["reproduce", "models:/nope@champion"]),
        ("reproduce junk", b / "h", [], ["reproduce", "not-a-uri"]),
        ("damaged store", b / "broken", [], ["report", "--profile", "smoke"]),
        ("home is a file", b / "afile" / "home", [], ["simulate", "--profile", "smoke"]),
    ]  # fmt: skip
    clean = 0
    for name, home, wrap, args in cases:
        t0 = time.monotonic()
        r = subprocess.run([*wrap, sys.executable, "-m", "flows.cli", *args], cwd=ROOT,
                           env=probe_env(home), capture_output=True, text=True)  # fmt: skip
        first = next((ln for ln in r.stderr.splitlines() if "error" in ln), "")
        ok = r.returncode in (2, 3) and "Traceback" not in r.stderr and first
        clean += bool(ok)
        print(f"  {name:<22} exit {r.returncode} {time.monotonic() - t0:5.1f} s "
              f"tracebacks {r.stderr.count('Traceback')}  {first[:110]}", flush=True)  # fmt: skip
    print(f"bad inputs: {len(cases)} tried, {clean} clear messages without a traceback")


# -- second pass: a copied home, a deleted model, a purged champion, a suspended process, a dead
# worker. Each row prints pass or FAIL and its seconds.
PAIR = [
    "--profile", "smoke", "--systems", "integro_de", "--methods", "node", "neural_laplace",
    "--epochs", "5", "--max-workers", "2", "--no-progress",
]  # fmt: skip
CHAMPION_URI = "models:/neural-laplace-integro_de@champion"


def _timedprint_row(name: str, ok: bool, seconds: float, detail: str) -> None:
    print(f"  {'pass' if ok else 'FAIL'}  {name:<34} {seconds:6.1f} s  {detail}", flush=True)


def _cli(home: Path, *args: str, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT,
                          env=env or probe_env(home), capture_output=True, text=True)  # fmt: skip


def _summary(out: str) -> str:
    return next((ln for ln in reversed(out.splitlines()) if " cells: " in ln), "?").strip()


def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if "error" in ln.lower()]


def _cell_runs(home: Path, status: str | None = None) -> list[tuple[str, str, str, str]]:
    """``(run id, status, config hash, artifact uri)`` of the active cell runs."""
    return [
        (run_id, st, h, _artifact_uri(home, run_id))
        for run_id, st, kind, h in _store_runs(home)
        if kind == "cell" and (status is None or st == status)
    ]


def _sql(home: Path, query: str, *args: object) -> list[tuple]:
    db = home / "mlflow" / "mlflow.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return con.execute(query, args).fetchall()


def _artifact_uri(home: Path, run_id: str) -> str:
    return _sql(home, "SELECT artifact_uri FROM runs WHERE run_uuid = ?", run_id)[0][0]


def _model_folder(home: Path, run_id: str) -> Path:
    """Where a cell run's model lies: its MLflow 3 logged model's folder, else (a run from
    before models were logged so) the run's ``model`` artifact folder."""
    rows = _sql(home, "SELECT artifact_location FROM logged_models WHERE source_run_id = ?", run_id)
    if rows:
        return Path(rows[0][0].removeprefix("file://"))
    return Path(_artifact_uri(home, run_id)) / "model"


def _tag(home: Path, run_id: str, key: str) -> str | None:
    rows = _sql(home, "SELECT value FROM tags WHERE run_uuid = ? AND key = ?", run_id, key)
    return rows[0][0] if rows else None


def _champion_run(home: Path) -> str:
    query = (
        "SELECT v.run_id FROM registered_model_aliases a JOIN model_versions v "
        "ON v.name = a.name AND v.version = a.version WHERE a.name = ? AND a.alias = 'champion'"
    )
    return _sql(home, query, "neural-laplace-integro_de")[0][0]


def _files(folder: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def home_faults(scratch: Path) -> None:
    """A copied home, a FINISHED run whose model was deleted, a champion whose model or run is
    gone: each on one home, in that order."""
    print("a copied home, deleted models, a purged champion")
    base = fresh_dir(scratch / "home")
    orig, copy = base / "orig", base / "copy"
    t0 = time.monotonic()
    first = _cli(orig, "benchmark", *PAIR, "--seeds", "0")
    shutil.copytree(orig, copy, symlinks=True)  # cp -a
    before = _files(orig)
    second = _cli(copy, "benchmark", *PAIR, "--seeds", "0", "1")  # 2 reused, 2 new cells
    after = _files(orig)
    touched = sum(after.get(f) != m for f, m in before.items()) + len(set(after) - set(before))
    shutil.rmtree(orig)
    again = _cli(copy, "reproduce", CHAMPION_URI)
    ok = first.returncode == second.returncode == again.returncode == 0 and touched == 0
    _timedprint_row("copied home stays independent", ok, time.monotonic() - t0,
         f"files written into the original: {touched}; reproduce in the copy after deleting "
         f"the original: exit {again.returncode}; {_summary(second.stdout)}")  # fmt: skip

    t0 = time.monotonic()
    champion = _champion_run(copy)
    victim = next(r for r, _, _, _ in _cell_runs(copy, "FINISHED") if r != champion)
    shutil.rmtree(_model_folder(copy, victim))
    rerun = _cli(copy, "benchmark", *PAIR, "--seeds", "0", "1")
    told = [ln for ln in (rerun.stdout + rerun.stderr).splitlines() if victim in ln]
    summary = _summary(rerun.stdout)
    ok = rerun.returncode == 0 and "1 finished, 3 reused" in summary and len(told) == 1
    _timedprint_row("finished run without its model", ok, time.monotonic() - t0,
         f"{summary}; lines naming the run: {len(told)}")  # fmt: skip

    t0 = time.monotonic()
    model = _model_folder(copy, champion)
    shutil.move(model, model.with_name("model.aside"))
    r = _cli(copy, "reproduce", CHAMPION_URI)
    lines = r.stderr.strip().splitlines()
    last = (lines or [""])[-1]
    ok = r.returncode in (2, 3) and len(_error_lines(r.stderr)) == 1 and champion in r.stderr
    ok = ok and "Traceback" not in r.stderr
    _timedprint_row("reproduce, champion's model missing", ok, time.monotonic() - t0,
         f"exit {r.returncode}, {len(lines)} stderr lines: …{last[-100:]}")  # fmt: skip
    shutil.move(model.with_name("model.aside"), model)

    t0 = time.monotonic()
    purge = (
        "import sys; from mlflow import MlflowClient; "
        "MlflowClient(sys.argv[1]).delete_run(sys.argv[2])"
    )
    uri = f"sqlite:///{copy / 'mlflow' / 'mlflow.db'}"
    subprocess.run([sys.executable, "-c", purge, uri, champion], env=probe_env(copy), check=True)
    subprocess.run([sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", uri,
                    "--run-ids", champion], env={**probe_env(copy), "MLFLOW_TRACKING_URI": uri},
                   check=True, capture_output=True)  # fmt: skip
    r = _cli(copy, "reproduce", CHAMPION_URI)
    gone_ok = r.returncode in (2, 3) and len(_error_lines(r.stderr)) == 1
    gone_ok = gone_ok and "Traceback" not in r.stderr
    rerun = _cli(copy, "benchmark", *PAIR, "--seeds", "0", "1")  # trains the purged cell again
    replaced = _champion_run(copy) != champion
    back = _cli(copy, "reproduce", CHAMPION_URI)
    ok = gone_ok and rerun.returncode == 0 and replaced and back.returncode == 0
    _timedprint_row("champion's run deleted and purged", ok, time.monotonic() - t0,
         f"reproduce exit {r.returncode} ({(_error_lines(r.stderr) or [''])[0][:60]}...); "
         f"retrain: {_summary(rerun.stdout)}; alias replaced: {replaced}; "
         f"reproduce then: exit {back.returncode}")  # fmt: skip


def _epochs_logged(home: Path, n: int) -> bool:
    """Whether a RUNNING cell run has logged ``n`` epochs."""
    try:
        rows = _sql(home, "SELECT COUNT(*) FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
                    "WHERE r.status = 'RUNNING' AND m.key = 'train_loss'")  # fmt: skip
    except sqlite3.Error:
        return False
    return rows[0][0] >= n


def suspended(scratch: Path, stale: float = 60.0) -> None:
    """Ctrl-Z (SIGSTOP to the process group) of a benchmark mid-cell for longer than the
    claim's stale time (``stale`` seconds here, longer than a command's start), the same command
    meanwhile, then SIGCONT."""
    home = fresh_dir(scratch / "suspended")
    env = {**probe_env(home), "NLLAB_CLAIM_STALE_SECONDS": str(stale)}
    one = ["benchmark", "--profile", "smoke", "--systems", "integro_de", "--methods",
           "neural_laplace", "--seeds", "0", "--epochs", "150", "--no-progress"]  # fmt: skip
    t0 = time.monotonic()
    a = subprocess.Popen([sys.executable, "-m", "flows.cli", *one], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)  # fmt: skip
    # Stopped between epochs, not inside a cell's first burst of writes: a process stopped
    # while it holds sqlite's write lock blocks every writer of the store until it resumes.
    while not _epochs_logged(home, 3) and a.poll() is None:
        time.sleep(0.2)
    os.killpg(a.pid, signal.SIGSTOP)
    b = _cli(home, *one, env=env)
    os.killpg(a.pid, signal.SIGCONT)
    out_a = a.communicate()[0]
    (home / "a.log").write_text(out_a)
    (home / "b.log").write_text(b.stdout + b.stderr)
    finished = _finished_cells(_store_runs(home))
    twice = sum(len(ids) > 1 for ids in finished.values())
    waiting = (b.stdout + b.stderr).count("waiting for cell")
    killed = [r for r, st, _, _ in _cell_runs(home, "KILLED")]
    fenced = sum("lost its claim" in (_tag(home, r, "error") or "") for r in killed)
    ok = twice == 0 and waiting == 1 and fenced == 1 and a.returncode == b.returncode == 0
    _timedprint_row("suspended past the stale time", ok, time.monotonic() - t0,
         f"cells trained twice: {twice}; 'waiting for cell' lines: {waiting}; resumed run "
         f"ended KILLED (lost claim): {fenced}; exits {a.returncode}/{b.returncode}; "
         f"resumed: {_summary(out_a)}; second: {_summary(b.stdout)}")  # fmt: skip
    for line in (b.stdout + b.stderr + out_a).splitlines():
        if "waiting for cell" in line or "lost its claim" in line:
            print(f"        {line.strip()[:160]}")


def worker_death(scratch: Path) -> None:
    """kill -9, then SIGTERM, of one worker process (process isolation) mid-cell."""
    for sig in (signal.SIGKILL, signal.SIGTERM):
        home = fresh_dir(scratch / f"worker-{sig.name}")
        cfg = home / "isolation.toml"
        cfg.write_text('isolation = "process"\n')
        # --no-pack: one cell a worker (integro and piecewise would pack their node cells)
        args = ["benchmark", "--profile", "smoke", "--systems", "integro_de",
                "piecewise_forcing_ode", "--methods", "node", "neural_laplace", "--seeds", "0",
                "--epochs", "20", "--max-workers", "2", "--no-progress", "--no-register",
                "--no-pack", "--config", str(cfg)]  # fmt: skip
        t0 = time.monotonic()
        p = _nllab(home, *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        victim = None
        while victim is None and p.poll() is None:
            time.sleep(0.2)
            running = _cell_runs(home, "RUNNING")
            if running:
                victim = int((_tag(home, running[0][0], "nllab.process") or "0").split(":")[0])
        if victim:
            os.kill(victim, sig)
        out = p.communicate()[0]
        runs = _cell_runs(home)
        count = {st: sum(x[1] == st for x in runs) for st in ("FINISHED", "FAILED", "RUNNING")}
        ok = count == {"FINISHED": 3, "FAILED": 1, "RUNNING": 0} and "BrokenProcessPool" not in out
        _timedprint_row(f"{sig.name} of one worker", ok, time.monotonic() - t0,
             f"cell runs {count}; exit {p.returncode}; BrokenProcessPool "
             f"{out.count('BrokenProcessPool')}, tracebacks {out.count('Traceback')}; "
             f"{_summary(out)}")  # fmt: skip


# -- second pass: strict config values, SIGTERM of tune, a full disk, two serves -----------------
def strict_inputs(scratch: Path) -> None:
    """Values of the wrong kind or out of range, and the smaller bad inputs: exit 2 (or 3 for
    an unreachable scheduler), one line, no traceback, before any training."""
    b = fresh_dir(scratch / "strict")
    files = {
        'hidden = "128"': '[models.node]\nhidden = "128"\n',
        "hidden = 128": "[models.node]\nhidden = 128\n",
        "epochs = true": "[training]\nepochs = true\n",
        'latent_dim = "4"': '[models.neural_laplace]\nlatent_dim = "4"\n',
        "latent_dim = -1": "[models.neural_laplace]\nlatent_dim = -1\n",
        'solver = "eular"': '[models.node]\nsolver = "eular"\n',
        'ilt = "talbott"': '[models.neural_laplace]\nilt = "talbott"\n',
    }
    cases: list[tuple[str, list[str], dict[str, str], tuple[int, ...]]] = []
    for name, body in files.items():
        f = b / f"{len(cases)}.toml"
        f.write_text(body)
        cases.append((name, ["benchmark", "--profile", "smoke", "--config", str(f)], {}, (2,)))
    (b / "afile").write_text("")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    one = ["--profile", "smoke", "--systems", "integro_de", "--methods", "node"]
    tune = ["tune", "--method", "node", "--system", "integro_de"]
    cases += [
        ("NLLAB_EXPERIMENT of 501 chars", ["report", "--profile", "smoke"],
         {"NLLAB_EXPERIMENT": "x" * 501}, (2,)),
        ("report --out a file", ["report", "--out", str(b / "afile")], {}, (2,)),
        ("tune --trials 0", [*tune, "--trials", "0"], {}, (2,)),
        ("--seeds 99999999999999999999", ["benchmark", *one, "--seeds", "9" * 20], {}, (2,)),
        ("tune --storage notaurl", [*tune, "--trials", "2", "--storage", "notaurl"], {}, (2,)),
        ("benchmark --tuned --storage notaurl",
         ["benchmark", *one, "--tuned", "--storage", "notaurl"], {}, (2,)),
        ("--dask-address, no scheduler", ["benchmark", *one, "--dask-address", dead], {}, (3,)),
        ("--task-runner thread --dask-address",
         ["benchmark", *one, "--task-runner", "thread", "--dask-address", dead], {}, (2,)),
    ]  # fmt: skip
    passed = 0
    for name, args, extra, codes in cases:
        t0 = time.monotonic()
        env = {**probe_env(b / "h"), **extra}
        r = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env,
                           capture_output=True, text=True)  # fmt: skip
        ok, detail = one_clear_line(r, codes)
        passed += print_row(name, ok, f"{time.monotonic() - t0:5.1f} s {detail}")
    print(f"strict inputs: {passed} of {len(cases)} refused with one line, no traceback")


def _study(home: Path, name: str) -> dict[str, int]:
    import optuna

    url = f"sqlite:///{home / 'optuna' / 'optuna.db'}"
    trials = optuna.load_study(study_name=name, storage=url).trials
    states = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
    return {s: sum(t.state.name == s for t in trials) for s in states}


def tune_ctrl_c(scratch: Path) -> None:
    """Ctrl-C (SIGINT to the process group) of ``nllab tune`` during a trial, then again."""
    tune_sigterm(scratch, sig=signal.SIGINT)


def tune_sigterm(scratch: Path, trials: int = 6, sig: int = signal.SIGTERM) -> None:
    """SIGTERM to ``nllab tune --trials 6`` during a trial, then the same command at once."""
    home = fresh_dir(scratch / f"tune-{signal.Signals(sig).name}")
    args = ["tune", "--method", "node", "--system", "integro_de", "--trials", str(trials),
            "--profile", "smoke"]  # fmt: skip
    p = _nllab(home, *args, "--epochs", "400", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
               start_new_session=True)  # fmt: skip
    t0 = time.monotonic()
    while time.monotonic() - t0 < 240:  # until a trial has run a while
        time.sleep(1)
        try:
            if _study(home, "node-integro_de-smoke")["RUNNING"]:
                break
        except (KeyError, Exception):
            continue
    time.sleep(5)
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)  # as the terminal sends Ctrl-C: to the whole group
    else:
        p.send_signal(sig)  # as `kill PID` does
    out = p.communicate()[0]
    runs = _store_runs(home)
    counts = _study(home, "node-integro_de-smoke")
    parent = [st for _, st, kind, _ in runs if kind == "tune"]
    code = 143 if sig == signal.SIGTERM else 130
    ok = p.returncode == code and "Traceback" not in out and counts["RUNNING"] == 0
    ok &= parent == ["KILLED"]
    print_row(f"{signal.Signals(sig).name} of nllab tune", ok, f"exit {p.returncode}, tracebacks "
         f"{out.count('Traceback')}, trials {counts}, parent run {parent}")  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "flows.cli", *args, "--epochs", "3"], cwd=ROOT,
                       env=probe_env(home), capture_output=True, text=True)  # fmt: skip
    counts = _study(home, "node-integro_de-smoke")
    runs = _store_runs(home)
    parent = [st for _, st, kind, _ in runs if kind == "tune"]
    finished = counts["COMPLETE"] + counts["PRUNED"]
    summary = next((ln for ln in r.stdout.splitlines() if ln.startswith("study ")), "?")
    print_row("the same command at once", r.returncode == 0 and finished == trials
         and parent == ["FINISHED"], f"exit {r.returncode}, {finished} of {trials} finished "
         f"trials; parent {parent} | {summary}")  # fmt: skip


def _tmpfs(path: Path, megabytes: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
                       capture_output=True)  # fmt: skip
    return r.returncode == 0


def _fill(path: Path) -> None:
    """Write ``path`` until its disk is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (2**20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                continue
    finally:
        os.close(fd)


def disk_full(scratch: Path) -> None:
    """A home on a small tmpfs (needs root): too little free space at the start, and a disk
    that fills up mid-run (a file written beside the store), then the same command once freed."""
    mnt = scratch / "full"
    subprocess.run(["umount", str(mnt)], capture_output=True)
    if not _tmpfs(mnt, 80):
        print("disk full: skipped (cannot mount a tmpfs here; needs root)")
        return
    try:
        home = mnt / "home"
        home.mkdir()
        filler = mnt / "filler"
        # 2.4 MB free at the start
        free = shutil.disk_usage(mnt).free
        subprocess.run(["fallocate", "-l", str(free - 2_400_000), str(filler)], check=True)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "flows.cli", "benchmark", *CELLS], cwd=ROOT,
                           env=probe_env(home), capture_output=True, text=True)  # fmt: skip
        ok, detail = one_clear_line(r, (3,))
        print_row("2.4 MB free at the start", ok and "MB free" in r.stderr,
             f"{time.monotonic() - t0:5.1f} s {detail}")  # fmt: skip
        filler.unlink()
        # fills up once the first cell has finished
        p = _nllab(home, "benchmark", *CELLS, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        head = []
        for line in p.stdout:
            head.append(line)
            if "Task run 'integro_de/" in line and "Completed()" in line:
                break
        _fill(filler)
        out = "".join(head) + p.communicate()[0]
        (scratch / "disk-full-midrun.log").write_text(out)
        r = subprocess.CompletedProcess(p.args, p.returncode, "", out)
        ok, detail = one_clear_line(r, (3,))
        print_row("disk fills up mid-run", ok and "is full" in out,
             f"{time.monotonic() - t0:5.1f} s {detail}")  # fmt: skip
        before = _finished_cells(_store_runs(home))
        filler.unlink()
        r = subprocess.run([sys.executable, "-m", "flows.cli", "benchmark", *CELLS], cwd=ROOT,
                           env=probe_env(home), capture_output=True, text=True)  # fmt: skip
        after = _finished_cells(_store_runs(home))
        lost = sum(set(after.get(h, [])) != set(ids) for h, ids in before.items())
        running = sum(st == "RUNNING" for _, st, _, _ in _store_runs(home))
        print_row("freed, the same command", r.returncode == 0 and not lost and not running,
             f"exit {r.returncode}, {len(before)} cells finished before, lost {lost}, "
             f"RUNNING {running}, tracebacks {r.stderr.count('Traceback')}")  # fmt: skip
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def tracking_lost(scratch: Path) -> None:
    """The MLflow tracking server killed once the first cell has finished. The client's HTTP
    retries are shortened (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=1``, timeout 10 s) so that the
    probe takes minutes, not the default retries' quarter of an hour."""
    home = fresh_dir(scratch / "tracking-lost")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    exe = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen(
        [str(exe), "server", "--backend-store-uri", f"sqlite:///{home / 'server.db'}",
         "--artifacts-destination", str(home / "artifacts"), "--serve-artifacts",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env={**probe_env(home), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        from flows.runtime.prefect_server import healthy as _healthy

        t0 = time.monotonic()
        while not _healthy(url) and time.monotonic() - t0 < 240:
            time.sleep(1)
        env = {**probe_env(home), "MLFLOW_TRACKING_URI": url,
               "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}  # fmt: skip
        p = subprocess.Popen([sys.executable, "-m", "flows.cli", "benchmark", *CELLS], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)  # fmt: skip
        head = []
        for line in p.stdout:
            head.append(line)
            if "Task run 'integro_de/" in line and "Completed()" in line:
                break
        os.killpg(server.pid, signal.SIGKILL)
        t0 = time.monotonic()
        out = "".join(head) + p.communicate(timeout=900)[0]
        (scratch / "tracking-lost.log").write_text(out)
        r = subprocess.CompletedProcess(p.args, p.returncode, "", out)
        ok, detail = one_clear_line(r, (3,))
        print_row("tracking server killed mid-run", ok and "stopped answering" in out,
             f"{time.monotonic() - t0:5.1f} s after the kill: {detail}")  # fmt: skip
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)


def _deployment_paused(api: str, name: str) -> bool | None:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api}/deployments/name/{name}", timeout=5) as r:
            return bool(json.loads(r.read())["paused"])
    except OSError:
        return None


def serve_pair(scratch: Path) -> None:
    """Two ``nllab serve`` on one Prefect server: Ctrl-C of the first leaves the second's
    deployments unpaused; the server stopped, the second says so and exits."""
    home = fresh_dir(scratch / "serve")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = f"http://127.0.0.1:{port}/api"
    schedules = home / "schedules.toml"
    schedules.write_text('[[schedule]]\nname = "nightly"\nflow = "benchmark"\ncron = "0 2 * * *"\n')
    env = {**probe_env(home), "PREFECT_HOME": str(home / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # fmt: skip
    exe = Path(sys.executable).with_name("prefect")
    server = subprocess.Popen([str(exe), "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        from flows.runtime.prefect_server import healthy as _healthy

        t0 = time.monotonic()
        while not _healthy(api) and time.monotonic() - t0 < 180:
            time.sleep(1)
        serveprobe_env = {**env, "PREFECT_API_URL": api}
        procs = []
        for _ in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "flows.cli", "serve", "--config", str(schedules)],
                cwd=ROOT, env=serveprobe_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, start_new_session=True))  # fmt: skip
            time.sleep(1)
        name = "nllab-scheduled-benchmark/nightly"
        t0 = time.monotonic()
        while time.monotonic() - t0 < 180 and _deployment_paused(api, name) is not False:
            time.sleep(1)
        time.sleep(25)  # both serving, both have beaten
        first = procs[0]
        os.killpg(first.pid, signal.SIGINT)
        t0 = time.monotonic()
        out0 = first.communicate(timeout=120)[0]
        seconds = time.monotonic() - t0
        paused = _deployment_paused(api, name)
        print_row("Ctrl-C of the first serve", first.returncode == 0 and paused is False
             and "Traceback" not in out0, f"exit {first.returncode} after {seconds:.1f} s; "
             f"the shared deployment paused: {paused}")  # fmt: skip
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        t0 = time.monotonic()
        second = procs[1]
        try:
            out1 = second.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            out1 = second.communicate()[0]
        seconds = time.monotonic() - t0
        last = (out1.strip().splitlines() or ["?"])[-1]
        (scratch / "serve-second.log").write_text(out1)
        print_row("the server stopped under the second", second.returncode == 3
             and "Traceback" not in out1, f"exit {second.returncode} after {seconds:.1f} s, "
             f"tracebacks {out1.count('Traceback')} | {last[:90]}")  # fmt: skip
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)


def main() -> None:
    _SECOND_PASS.update(THIRD_PASS)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=4)
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/nllab-probes"))
    ap.add_argument(
        "--only",
        choices=("race", "ctrl-c", "bad", "kill9", "twins", *_SECOND_PASS),
    )
    ap.add_argument(
        "--kill-at",
        type=float,
        nargs="+",
        default=[1.0, 3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 21.0, 24.0, 27.0, 31.0, 35.0],
        metavar="SECONDS",
        help="when to kill -9 the benchmark, in seconds after it starts (one fresh home each)",
    )
    a = ap.parse_args()
    if a.tries < 1 or min(a.kill_at) < 0:
        ap.error("--tries must be at least 1 and --kill-at times at least 0 seconds")
    if a.only in (None, "race"):
        race(a.scratch, a.tries)
    if a.only in (None, "ctrl-c"):
        ctrl_c(a.scratch)
    if a.only in (None, "bad"):
        bad_inputs(a.scratch)
    if a.only in (None, "kill9"):
        kill9(a.scratch, a.kill_at)
    if a.only in (None, "twins"):
        twins(a.scratch)
    for name, probe in _SECOND_PASS.items():
        if a.only in (None, name):
            probe(a.scratch)


#: Probes of the second pass, by ``--only`` name.
_SECOND_PASS = {
    "home": home_faults,
    "suspend": suspended,
    "worker": worker_death,
    "strict": strict_inputs,
    "tune-sigterm": tune_sigterm,
    "tune-ctrl-c": tune_ctrl_c,
    "disk-full": disk_full,
    "serve": serve_pair,
    "tracking-lost": tracking_lost,
}

if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics(defer=True)  # the probes' commands inherit the mode's environment
    main()
