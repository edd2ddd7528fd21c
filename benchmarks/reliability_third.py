"""Third-pass reliability probes, run by ``benchmarks/reliability.py --only NAME``:

- ``diverged``: a smoke benchmark with ``[training] lr = 1000.0``, ``epochs = 30`` (node, anode,
  Neural Laplace on integro_de): exit 0, each diverged cell flagged in one line, nothing
  registered.
- ``storage``: ``tune --storage sqlite:///`` (in memory) and ``sqlite:////nonexistent/dir/x.db``:
  exit 2, one line, no folder created.
- ``absurd``: ``--epochs 99999999999999999999``, ``epochs = 1e20``, ``epochs = 10**12``,
  ``hidden = [100000000, 100000000]`` and a model past the free memory: exit 2, one line.
- ``busy``: Prefect's start timeout missed; the store held (``BEGIN IMMEDIATE``) or made immutable
  (``chattr +i``) mid-run; a 621-character home; ``report --out`` where nothing can be written;
  ``ui --port 99999|-1``; ``serve`` with a dead ``PREFECT_API_URL``; Ctrl-C of ``serve
  --start-server``; ``--config`` a folder: one line each, exit 2, 3 or 130, no traceback.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from probe_common import ROOT, fresh_dir, one_clear_line, print_row, probe_env

SMOKE = ["--profile", "smoke", "--systems", "integro_de", "--methods", "node", "--no-progress"]
# Holds the store's write lock, as a process stopped (Ctrl-Z) inside a write does.
_HOLD = (
    "import sqlite3, sys, time\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "db.execute('BEGIN IMMEDIATE')\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


def _run(home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600):
    full = {**probe_env(home), **(env or {})}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=full,
                       capture_output=True, text=True, timeout=timeout)  # fmt: skip
    return r, time.monotonic() - t0


def _case(name: str, home: Path, args: list[str], codes: tuple[int, ...], **kw) -> bool:
    r, seconds = _run(home, *args, **kw)
    ok, detail = one_clear_line(r, codes)
    return print_row(name, ok, f"{seconds:5.1f} s {detail}")


def diverged(scratch: Path) -> None:
    home = fresh_dir(scratch / "diverged")
    config = home / "lr.toml"
    config.write_text('profile = "smoke"\n[training]\nlr = 1000.0\nepochs = 30\n')
    methods = ["--methods", "node", "anode", "neural_laplace", "--no-progress"]
    r, seconds = _run(home / "h", "benchmark", "--config", str(config), "--systems", "integro_de",
                      *methods)  # fmt: skip
    db = sqlite3.connect(home / "h" / "mlflow" / "mlflow.db")
    versions = db.execute("select count(*) from model_versions").fetchone()[0]
    flagged = db.execute("select count(*) from tags where key = 'diverged'").fetchone()[0]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("cell ") and "diverged" in ln]
    ok = r.returncode == 0 and versions == 0 and "@champion" not in r.stdout
    ok = ok and flagged == len(lines) > 0
    print_row("lr = 1000: nothing registered", ok,
         f"{seconds:5.1f} s exit {r.returncode}, {len(lines)} cells flagged diverged, "
         f"{versions} model versions registered")  # fmt: skip


def storage(scratch: Path) -> None:
    home = fresh_dir(scratch / "storage")
    tune = ["tune", "--method", "node", "--system", "integro_de", "--trials", "1", "--storage"]
    _case("tune --storage sqlite:///", home, [*tune, "sqlite:///"], (2,))
    _case("tune --storage sqlite:// (memory)", home, [*tune, "sqlite://"], (2,))
    missing = home / "nonexistent" / "dir"
    ok = _case("tune --storage in a missing folder", home, [*tune, f"sqlite:///{missing}/x.db"],
               (2,))  # fmt: skip
    print_row(
        "  ... and no folder created", ok and not missing.parent.exists(), str(missing.parent)
    )


def absurd(scratch: Path) -> None:
    home = fresh_dir(scratch / "absurd")
    _case("--epochs 99999999999999999999", home,
          ["benchmark", *SMOKE, "--epochs", "9" * 20], (2,))  # fmt: skip
    bodies = {
        "epochs = 1e20": "[training]\nepochs = 1e20\n",
        "epochs = 10**12": "[training]\nepochs = 1000000000000\n",
        "hidden = [1e8, 1e8]": "[models.node]\nhidden = [100000000, 100000000]\n",
        "hidden = [65536] * 4 (memory)": "[models.node]\nhidden = [65536, 65536, 65536, 65536]\n",
    }
    for i, (name, body) in enumerate(bodies.items()):
        f = home / f"{i}.toml"
        f.write_text(f'profile = "smoke"\n{body}')
        _case(name, home / "h", ["benchmark", *SMOKE, "--config", str(f)], (2,))


def _held_store(home: Path) -> None:
    code = "from tasks.tracking import connect; connect()"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=probe_env(home), check=True)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(home / "mlflow" / "mlflow.db")],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    holder.stdout.readline()
    try:
        r, seconds = _run(home, "benchmark", *SMOKE)
    finally:
        holder.kill()
        holder.wait()
    ok, detail = one_clear_line(r, (3,))
    print_row("store held (BEGIN IMMEDIATE)", ok and "is busy (held by pid" in r.stderr,
         f"{seconds:5.1f} s {detail}")  # fmt: skip


def _immutable_store(home: Path) -> None:
    cells = [*SMOKE[:-1], "anode", "--seeds", "0", "1", "--no-progress"]
    p = subprocess.Popen([sys.executable, "-m", "flows.cli", "benchmark", *cells], cwd=ROOT,
                         env=probe_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)  # fmt: skip
    db, out, t0 = home / "mlflow" / "mlflow.db", [], time.monotonic()
    for line in p.stdout:
        out.append(line)
        if " to run in " in line:  # cells planned: training starts
            if subprocess.run(["chattr", "+i", str(db)]).returncode:
                p.kill()
                print_row("store made immutable mid-run", True, "skipped: no chattr here")
                return
            break
    out.append(p.stdout.read())
    p.wait()
    if db.exists():
        subprocess.run(["chattr", "-i", str(db)])
    text = "".join(out)
    errors = [ln for ln in text.splitlines() if "error:" in ln]
    ok = p.returncode == 3 and "Traceback" not in text and len(errors) == 1
    print_row("store made immutable mid-run", ok and "is read-only" in errors[0],
         f"{time.monotonic() - t0:5.1f} s exit {p.returncode}, {len(text.splitlines())} lines: "
         f"{errors[0][:90] if errors else '?'}")  # fmt: skip


def _serve_ctrl_c(home: Path) -> None:
    p = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--start-server", "--port",
                          "4397"], cwd=ROOT, env=probe_env(home), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    t0 = time.monotonic()
    for line in p.stdout:
        if line.startswith("to trigger"):
            break
    time.sleep(2)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    ok = p.returncode == 130 and "Traceback" not in out + err
    print_row(
        "Ctrl-C of serve --start-server",
        ok,
        f"{time.monotonic() - t0:5.1f} s exit {p.returncode}: {err.strip()[-80:]}",
    )


def busy(scratch: Path) -> None:
    home = fresh_dir(scratch / "busy")
    _case("Prefect start timeout missed", home / "t", ["benchmark", *SMOKE], (3,),
          env={"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "1"})  # fmt: skip
    _case("serve --start-server, start missed", home / "t", ["serve", "--start-server", "--port",
          "4396"], (3,), env={"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "1"})  # fmt: skip
    _held_store(home / "held")
    _immutable_store(home / "immutable")
    deep = home.joinpath(*["d" * 61] * 10)
    _case(f"a {len(str(deep))}-character home", deep, ["benchmark", *SMOKE], (2,))
    _case("report --out /proc/self/x", home / "r", ["report", "--out", "/proc/self/x"], (2,))
    for port in ("99999", "-1"):
        _case(f"ui --port {port}", home / "u", ["ui", "--port", port], (2,))
    _case("serve, PREFECT_API_URL dead", home / "s", ["serve"], (3,),
          env={"PREFECT_API_URL": "http://127.0.0.1:9/api"})  # fmt: skip
    _serve_ctrl_c(home / "c")
    _case("--config a folder", home / "f", ["benchmark", "--config", str(home)], (2,))


#: The third pass's probes, by ``--only`` name.
THIRD_PASS = {"diverged": diverged, "storage": storage, "absurd": absurd, "busy": busy}
