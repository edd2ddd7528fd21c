"""No hidden global state: nothing of the project leaves Python's ``random`` or numpy's legacy
global generator other than it found them (Prefect draws its temporary server's port from
``random``: a command that left it seeded made every command pick the same ports, and two
commands in two homes shared one server), and a temporary server that answers on the port is
used only when it is the command's own."""

from __future__ import annotations

import http.server
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from prefect.server.api.server import SubprocessASGIServer

from flows.runtime._temporary_server import GuardedServer, serves
from nltrain import seeded, torch_threads
from nltrain.numerics import PINNED_SETTINGS, training_digest

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def unchanged_globals() -> Iterator[None]:
    """Fails when the block leaves ``random``'s or numpy's global state changed."""
    random.seed()  # a state of its own, not one a seed of the project's would give
    np.random.seed()  # noqa: NPY002
    python_state, numpy_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    yield
    assert random.getstate() == python_state, "Python's global random state was changed"
    after = np.random.get_state()  # noqa: NPY002
    assert after[0] == numpy_state[0] and np.array_equal(after[1], numpy_state[1])
    assert after[2:] == numpy_state[2:], "numpy's legacy global state was changed"


def test_seeded_restores_python_and_numpy_globals_and_seeds_them_inside():
    with unchanged_globals():
        with seeded(7):
            inside = random.random(), float(np.random.rand())  # noqa: NPY002
    with seeded(7):  # a plugin drawing from them in its constructor still gets its seed's draws
        assert (random.random(), float(np.random.rand())) == inside  # noqa: NPY002


def test_seeded_restores_the_globals_when_the_build_fails():
    with unchanged_globals(), pytest.raises(ValueError), seeded(1):
        random.random()
        raise ValueError("a constructor's refusal")


def test_torch_threads_sets_the_count_inside_and_puts_the_callers_back_on_an_error_too():
    own = torch.get_num_threads()
    other = own + 1
    with torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == own
    with pytest.raises(RuntimeError, match="inside"), torch_threads(other):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == own
    with pytest.raises(ValueError, match="thread count must be >= 1, got 0"), torch_threads(0):
        pass
    assert torch.get_num_threads() == own


_ALONE = """
import random, numpy as np, nlmodels
nlmodels.set_up_numerics()
from tests.test_global_state import unchanged_globals
from tests.cells import tiny_cell
from nltrain import evaluate, train
from tasks.pipeline import build_cell_model, prepare_cell, simulate_data
cell = tiny_cell()
with unchanged_globals():
    prepared = prepare_cell(cell, simulate_data(cell.system, cell.data, cell.seed))
    model, _ = build_cell_model(cell, int(prepared.train.obs_x.shape[-1]))
    train(model, prepared.train, prepared.val, cell.training, seed=cell.seed)
    evaluate(model, prepared.test, prepared.normaliser, batch_size=8)
print("unchanged")
"""


@pytest.mark.heavy  # a cell through the worker's whole path
def test_a_smoke_cell_trained_as_a_worker_does_leaves_the_globals_unchanged(tmp_path):
    """In a process of its own, as a worker trains (in this one, threads other tests left
    behind, Prefect's or MLflow's, may draw from ``random`` meanwhile)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NLLAB_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", _ALONE], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0 and out.stdout.strip() == "unchanged", out.stderr[-3000:]


def test_the_numerics_canaries_leave_the_globals_unchanged():
    method, settings, dim = next(v for v in PINNED_SETTINGS.values() if v[0] == "node")
    with unchanged_globals():
        training_digest(method, settings, dim)


def test_the_temporary_servers_port_is_drawn_from_a_generator_of_its_own(monkeypatch):
    """Prefect's own choice draws from ``random`` (so its state changes, and a seeded one gives
    every process the same port)."""
    monkeypatch.setattr(SubprocessASGIServer, "_instances", {})
    server = GuardedServer()
    with unchanged_globals():
        ports = {server.find_available_port() for _ in range(20)}
    assert ports <= set(range(8000, 9000)) and len(ports) > 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args) -> None:
        pass


@contextmanager
def _foreign_server() -> Iterator[int]:
    """Another process's server (here: this test's) answering every health check on a port."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


#: A stand-in for the server process: answers health checks on its port, or exits 1 when the
#: port is taken (as the guarded uvicorn does).
_STAND_IN = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"true")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_serves_tells_the_process_that_listens_on_a_port():
    with _foreign_server() as port:
        assert serves(os.getpid(), port)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not serves(child.pid, port)
        finally:
            child.kill()
            child.wait()
        assert not serves(os.getpid(), _free_port())


def test_a_server_answering_on_the_port_picked_is_not_used_another_port_is(monkeypatch, tmp_path):
    """Two commands picked one port: the second's server cannot bind, while the first's answers
    its health check. The second must not take the first's for its own."""
    monkeypatch.setattr(SubprocessASGIServer, "_instances", {})
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    started: list[subprocess.Popen] = []

    def stand_in(self) -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "-c", _STAND_IN, str(self.port)]))
        return started[-1]

    monkeypatch.setattr(GuardedServer, "_run_uvicorn_command", stand_in)
    with _foreign_server() as taken:
        free = _free_port()
        picks: Iterator[int] = iter([taken, free])
        monkeypatch.setattr(GuardedServer, "find_available_port", lambda s: next(picks))
        server = GuardedServer()
        try:
            server.start(timeout=60)
            assert server.port == free and server.server_process is started[-1]
            assert serves(started[-1].pid, free)
            assert started[0].wait(timeout=10) is not None  # the first try was ended
        finally:
            for proc in started:
                proc.kill()
                proc.wait()


def _benchmark(home: Path) -> subprocess.Popen:
    """A smoke benchmark of one cell in ``home``, with its own Prefect home and store, as a
    user runs it (no ``PREFECT_API_URL``: it starts a temporary server)."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "NLLAB_"))},
        "PYTHONPATH": str(ROOT),
        "NLLAB_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
    }
    env.pop("PREFECT_API_URL", None)
    argv = "benchmark --profile smoke --systems integro_de --methods node --epochs 1"
    home.mkdir(parents=True)
    with open(home.with_suffix(".out"), "w") as out:  # (a pipe could fill while others run)
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *argv.split()],
            cwd=home.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _all_at_once(homes: list[Path], start: Callable[[Path], subprocess.Popen]) -> list[tuple]:
    """Each home's command started a second apart, as a user starts them; (exit code, output)."""
    procs = []
    for home in homes:
        procs.append(start(home))
        time.sleep(1.0)
    return [(p.wait(timeout=900), h.with_suffix(".out").read_text()) for p, h in zip(procs, homes)]


@pytest.mark.slow
def test_three_commands_in_three_homes_at_once_each_use_their_own_server(tmp_path):
    homes = [tmp_path / f"home{i}" for i in range(3)]
    for code, output in _all_at_once(homes, _benchmark):
        assert code == 0, output[-3000:]
        assert "address already in use" not in output.lower()
    for home in homes:
        log = home / "logs" / "prefect-server.log"
        text = log.read_text() if log.exists() else ""
        assert "address already in use" not in text.lower(), text[-2000:]
        assert len(list((home / "prefect").glob("*.db"))) == 1  # its own flow runs, at home
