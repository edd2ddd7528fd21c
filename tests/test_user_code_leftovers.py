"""User code does not outlive the command: a plugin model's non-daemon thread does not keep
``nllab`` alive after its work (one line names it), the processes a simulator started end with
the command, and a Ctrl-C while the process exits gives 130, never 0. Each test runs ``python -m
flows.cli`` as the program (the session's Prefect server, no temporary one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from terminal import takes_ctrl_c

ROOT = Path(__file__).resolve().parents[1]

_LINGERING = """
    import threading, time
    import torch
    from nlmodels import ForecastModel

    class Last(ForecastModel):  # a model that starts a poller it never stops
        def __init__(self, state_dim: int, *, gain: float = 1.0) -> None:
            super().__init__()
            self.gain = torch.nn.Parameter(torch.tensor(gain, dtype=torch.float64))
            threading.Thread(target=time.sleep, args=(1000,), name="plugin-poller").start()

        def forward(self, obs_t, obs_x, query_t):
            return self.gain * obs_x[:, -1:, :].expand(-1, query_t.shape[-1], -1)
"""
_SLEEPY = """
    import subprocess
    import numpy as np

    def decay(n_trajectories, seed):  # a simulator that leaves a process behind
        subprocess.Popen(["sleep", "1000", "{token}"])
        t = np.linspace(0.0, 3.0, 12)
        x0 = np.random.default_rng(seed).uniform(1.0, 2.0, n_trajectories)
        return t, (x0[:, None] * np.exp(-t))[..., None]
"""
_SLOW_EXIT = """
    import atexit, time
    from pathlib import Path
    import torch
    from nlmodels import ForecastModel

    def _slow_exit():  # user code that takes its time as the interpreter exits
        Path({marker!r}).touch()
        time.sleep(600)

    atexit.register(_slow_exit)

    class Last(ForecastModel):
        def __init__(self, state_dim: int, *, gain: float = 1.0) -> None:
            super().__init__()
            self.gain = torch.nn.Parameter(torch.tensor(gain, dtype=torch.float64))

        def forward(self, obs_t, obs_x, query_t):
            return self.gain * obs_x[:, -1:, :].expand(-1, query_t.shape[-1], -1)
"""


def _user_code(tmp_path: Path, **modules: str) -> Path:
    folder = tmp_path / "user"
    folder.mkdir()
    for name, text in modules.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(text))
    return folder


def _nllab(tmp_path: Path, prefect_api: str, user: Path, *args: str, **kw) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(user)]),
        "NLLAB_HOME": str(tmp_path / "home"),
        "PREFECT_API_URL": prefect_api,
    }
    command = ["benchmark", "--profile", "smoke", "--epochs", "2", "--no-register"]
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *command, "--no-progress", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _sleeps(token: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if p.info["cmdline"] == ["sleep", "1000", token]:
            found.append(p)
    return found


@pytest.mark.heavy  # a benchmark command with a plugin's leftovers
def test_a_plugins_thread_and_a_simulators_children_do_not_outlive_the_command(
    tmp_path, mlflow_store, prefect_api
):
    token = f"0.{os.getpid()}{time.monotonic_ns() % 10**6}"  # this test's sleeps, no others
    user = _user_code(tmp_path, lingering=_LINGERING, sleepy=_SLEEPY.replace("{token}", token))
    config = tmp_path / "sleepy.toml"
    config.write_text('[define_systems.decay]\nsimulator = "sleepy:decay"\n')
    proc = _nllab(
        tmp_path, prefect_api, user, "--systems", "decay", "--methods", "lingering:Last",
        "--config", str(config),
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=300)  # it hung after its summary for ever
        assert proc.returncode == 0, err
        assert "1 cells: 1 finished" in out
        line = "thread(s) that user code left running would keep the process alive, abandoned"
        assert f"{line}: 'plugin-poller'" in err
        assert "process(es) that user code left running: sleep 1000" in err
        assert _sleeps(token) == []
        assert "Traceback" not in err
    finally:
        proc.kill()
        for p in _sleeps(token):
            p.kill()


@pytest.mark.heavy  # a command in a terminal, Ctrl-C as it exits
def test_ctrl_c_while_the_command_exits_gives_130_not_0(tmp_path, mlflow_store, prefect_api):
    marker = tmp_path / "exiting"
    user = _user_code(tmp_path, slow_exit=_SLOW_EXIT.format(marker=str(marker)))
    proc = _nllab(
        tmp_path, prefect_api, user, "--systems", "integro_de", "--methods", "slow_exit:Last",
        # Ctrl-C reaches it even when the suite runs as a background job (which ignores SIGINT)
        preexec_fn=takes_ctrl_c,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 400
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # the work is done, its exit is under way
        # ends at the Ctrl-C, not after the handler's 600 s (the bound is against those, not
        # the few seconds of an exit that a loaded machine may stretch)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err  # was 0, with a traceback of the atexit handler
        assert "1 cells: 1 finished" in out
        assert "Traceback" not in err
    finally:
        proc.kill()
