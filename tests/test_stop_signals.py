"""User code is contained and SIGTERM stops a command as Ctrl-C does, seen from outside: a real
``nllab`` process, its output, exit code and store.

A simulator that calls ``sys.exit(0)`` or makes NaN ends its own data set in one line; one that
hangs is abandoned at once on SIGTERM (exit 143, one line of ours, nothing of Prefect's crash
path, no leaked semaphore); SIGTERM mid-training ends the running cell KILLED, in the store and
in its log line, and keeps the finished one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What never reaches the console of a stopped command.
NEVER = ("Traceback", "Crash detected", "leaked semaphore")

SIMULATORS = """
import sys, time
from pathlib import Path
import numpy as np

def _ramp(n):
    t = np.linspace(0.0, 1.0, 6)
    return t, (np.arange(n, dtype=float)[:, None] + t)[..., None]

def exits(n, seed):          # fine when declared (3 trajectories), not when simulated
    if n > 10:
        sys.exit(0)
    return _ramp(n)

def nan_later(n, seed):
    t, x = _ramp(n)
    if n > 10:
        x[-1, 2, 0] = np.nan
    return t, x

def hangs(n, seed):
    if n > 10:  # said in a file beside this one: the test stops the command while it hangs
        (Path(__file__).parent / "hanging").touch()
    while n > 10:
        time.sleep(0.05)
    return _ramp(n)

def exits_at_once(n, seed):
    sys.exit(0)
"""

SLOW_MODEL = """
import multiprocessing, threading, time
import torch
from nlmodels import ForecastModel

def in_worker():
    return multiprocessing.parent_process() is not None

class Slow(ForecastModel):  # as it trains (a worker thread or process), a batch takes 1-2 s
    def __init__(self, state_dim: int, *, gain: float = 1.0) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(torch.tensor(gain, dtype=torch.float64))

    def forward(self, obs_t, obs_x, query_t):
        if threading.current_thread() is not threading.main_thread() or in_worker():
            time.sleep(1.5)
        return self.gain * obs_x[:, -1:, :].expand(-1, query_t.shape[-1], -1)
"""


def _env(tmp_path: Path, api: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NLLAB_"))}
    return {
        **env,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
        "NLLAB_HOME": str(tmp_path / "home"),
        "PREFECT_API_URL": api,
    }


class _Nllab:
    """``nllab ARGS`` in a subprocess, its output read as it comes."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own process group, for a signal to the whole group
        )  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for(self, *texts: str, seconds: float = 240) -> None:
        self.wait_until(lambda: all(t in self.out for t in texts), seconds)

    def wait_until(self, done: Callable[[], bool], seconds: float = 240) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.out
            time.sleep(0.1)

    def stop(self, sig: int, seconds: float = 60, group: bool = False) -> tuple[int, float]:
        t0 = time.monotonic()
        if group:  # as a terminal, systemd (KillMode=control-group) or `kill -- -PGID` send it
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=seconds)
        elapsed = time.monotonic() - t0
        # the reader's last lines: it ends at the end of the output (a fixed pause could end
        # first on a loaded machine, cutting the lines asserted on)
        self.reader.join(60)
        return code, elapsed


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.heavy  # a hung simulator waited out
def test_user_simulators_end_their_own_data_set_and_sigterm_abandons_a_hang(tmp_path, prefect_api):
    (tmp_path / "usersims.py").write_text(SIMULATORS)
    env = _env(tmp_path, prefect_api)

    # Declared (the command's own thread): one line naming the function, never a silent 0.
    _config(tmp_path, '[define_systems.s]\nsimulator = "usersims:exits_at_once"\n')
    r = subprocess.run(
        [sys.executable, "-m", "flows.cli", "systems", "--config", str(tmp_path / "c.toml")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr  # user code failing, not a setting
    assert r.stderr.strip() == (
        "nllab systems: error: simulator 'usersims:exits_at_once' called sys.exit(0)"
    )

    cfg = _config(
        tmp_path,
        """
        systems = ["s_exit", "s_nan", "s_hang"]
        methods = ["node"]
        [define_systems.s_exit]
        simulator = "usersims:exits"
        [define_systems.s_nan]
        simulator = "usersims:nan_later"
        [define_systems.s_hang]
        simulator = "usersims:hangs"
        """,
    )
    run = _Nllab(env, "benchmark", "--profile", "smoke", "--config", str(cfg), "--no-progress")
    run.wait_for("simulate s_exit seed 0' - Finished", "simulate s_nan seed 0' - Finished")
    run.wait_until((tmp_path / "hanging").exists)  # the hanging simulation runs on
    code, seconds = run.stop(signal.SIGTERM)
    out = run.out
    assert code == 143 and seconds < 20, (code, seconds, out)
    assert "simulator 'usersims:exits' called sys.exit(0)" in out
    assert (
        "simulator 'usersims:nan_later': non-finite value (nan) in trajectory 39 at t = 0.4" in out
    )
    assert "Finished in state Cancelled('simulate s_hang seed 0: interrupted" in out
    assert not [n for n in NEVER if n in out], out
    assert out.rstrip().endswith(
        "nllab benchmark: interrupted; finished cells are kept, run again to resume"
    ), out


@pytest.mark.parametrize(
    "isolation, group",
    [
        pytest.param("thread", False, id="to the command, cells in threads"),
        # (worker processes started and stopped: the heavy tier)
        pytest.param(
            "process",
            True,
            marks=pytest.mark.heavy,
            id="to its process group, cells in worker processes",
        ),
    ],
)
def test_sigterm_mid_training_ends_the_running_cell_killed_and_keeps_the_finished_one(
    tmp_path, prefect_api, isolation, group
):
    from tasks.config import TrackingConfig
    from tasks.tracking import connect

    (tmp_path / "slowmod.py").write_text(SLOW_MODEL)
    cfg = _config(tmp_path, f'isolation = "{isolation}"\nmax_workers = 1\n')
    run = _Nllab(
        _env(tmp_path, prefect_api),
        "benchmark", "--profile", "smoke", "--systems", "integro_de", "--methods", "node",
        "slowmod:Slow", "--config", str(cfg), "--no-progress",
    )  # fmt: skip
    run.wait_for("Task run 'integro_de/node/seed0' - Finished in state Completed()")
    store = tmp_path / "home" / "mlflow" / "mlflow.db"
    tracker = connect(TrackingConfig(tracking_uri=f"sqlite:///{store}"))
    deadline = time.monotonic() + 120
    query = "tags.method = 'slowmod:Slow' and attributes.status = 'RUNNING'"
    while not tracker.store.client.search_runs([tracker.experiment_id], query):
        assert time.monotonic() < deadline, run.out
        time.sleep(0.2)
    code, seconds = run.stop(signal.SIGTERM, group=group)
    out = run.out
    assert code == 143 and seconds < 30, (code, seconds, out)
    assert "Task run 'integro_de/slowmod:Slow/seed0' - Finished in state Cancelled(" in out
    assert "interrupted: 1 cell KILLED" in out
    assert not [n for n in NEVER if n in out], out
    assert out.rstrip().endswith("interrupted; finished cells are kept, run again to resume")
    runs = tracker.store.client.search_runs([tracker.experiment_id], "")
    status = {r.data.tags.get("method", r.data.tags.get("nllab.kind")): r.info.status for r in runs}
    assert status["node"] == "FINISHED" and status["slowmod:Slow"] == "KILLED", status
    assert status["benchmark"] == "KILLED", status


def _raises_keyboard_interrupt():
    raise KeyboardInterrupt


def _calls_sys_exit():
    sys.exit(3)


def test_user_code_leaving_by_sys_exit_or_its_own_keyboard_interrupt_is_an_error_naming_it():
    from tasks.errors import Interrupted
    from tasks.stopping import Stopped, UserCodeExit, abandonable, contained

    stop = threading.Event()
    with pytest.raises(UserCodeExit, match=r"_raises_keyboard_interrupt raised KeyboardInterrupt"):
        abandonable(_raises_keyboard_interrupt, stop, "simulate")  # off the main thread
    with pytest.raises(UserCodeExit, match=r"test_stop_signals:_calls_sys_exit called sys.exit\(3"):
        abandonable(_calls_sys_exit, None, "simulate")
    with pytest.raises(Stopped), contained():  # a real stop signal goes through
        raise Stopped(signal.SIGTERM)

    def hang():
        while True:
            time.sleep(0.05)

    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(Interrupted, match="abandoned"):
        abandonable(hang, stop, "simulate s seed 0")  # left to hang in its daemon thread
    # abandoned at the stop (0.3 s, then the 0.2 s poll), not waited for: the hang never ends,
    # so the bound only has to be finite; seconds of a loaded machine's scheduling are not it
    assert time.monotonic() - t0 < 30
