"""Scale-out as separate processes on one machine (``docs/scale-out.md``): a throwaway PostgreSQL
cluster, an ``mlflow server`` on it, ``prefect server start``, ``dask scheduler`` and two
single-threaded ``dask worker`` processes, all on 127.0.0.1 and in temporary folders.

* ``nllab benchmark --dask-address`` logs every cell to the MLflow server (one FINISHED child run
  per cell, read back through the server's REST API);
* ``kill -9`` of a worker in the middle of a cell loses nothing: Dask runs its cells again on the
  other worker, and every cell ends with exactly one FINISHED run of its config hash;
* two ``nllab tune`` processes on one Optuna study stored in PostgreSQL end at the study's trial
  count.

Deselected by default (``-m cluster``; ``make test-cluster`` installs PostgreSQL and the driver).
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

HOST = "127.0.0.1"
SYSTEMS = ("integro_de", "spiral_dde")
METHODS = ("neural_laplace", "node")
BIN = Path(sys.executable).parent  # the venv's console scripts: nllab, mlflow, prefect, dask


# -- processes -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Service:
    """A process started in its own process group; :meth:`stop` ends the whole group."""

    name: str
    proc: subprocess.Popen
    log: Path
    stop_signal: int = signal.SIGTERM

    def tail(self, n: int = 40) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- {self.name} ({self.log}) ---\n" + "\n".join(lines[-n:])

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, grace: float = 15.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, self.stop_signal)
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                return
        # Children that outlived the leader (e.g. server workers) go too.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def start(
    name: str, cmd: list[str], log_dir: Path, env: dict[str, str] | None = None, user: str = ""
) -> Service:
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
    log = log_dir / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return Service(name, proc, log)


def wait_until(
    what: str, ok: Callable[[], bool], timeout: float, services: list[Service] = ()
) -> None:
    """Poll ``ok`` until true; fail after ``timeout`` s or as soon as a service has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except Exception:
            pass
        for s in services:
            if s.proc.poll() is not None:
                pytest.fail(
                    f"{s.name} exited ({s.proc.returncode}) while waiting for {what}\n" + s.tail()
                )
        time.sleep(0.5)
    pytest.fail(
        f"timed out after {timeout:.0f} s waiting for {what}\n"
        + "\n".join(s.tail() for s in services)
    )


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status == 200


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((HOST, port)) == 0


# -- services ------------------------------------------------------------------------------------
def _pg_bin(tool: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}"))
    path = found[-1] if found else shutil.which(tool)
    if not path:
        pytest.fail(
            f"PostgreSQL's {tool} not found: install Debian's postgresql package "
            "(`make test-cluster` does)"
        )
    return path


@pytest.fixture(scope="module")
def cluster_dir() -> Iterator[Path]:
    # Not pytest's tmp_path: that folder is private to root, and PostgreSQL runs as `postgres`.
    d = Path(tempfile.mkdtemp(prefix="nllab-cluster-"))
    d.chmod(0o755)
    (d / "logs").mkdir()
    yield d
    keep = os.environ.get("NLLAB_CLUSTER_LOGS")  # where to copy every service's log, if set
    if keep:
        shutil.copytree(d / "logs", Path(keep), dirs_exist_ok=True)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres(cluster_dir) -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1; yields its URL prefix (no database)."""
    pytest.importorskip("psycopg2", reason="pip install psycopg2-binary (the `cluster` extra)")
    import psycopg2

    user = ""
    data = cluster_dir / "pgdata"
    sockets = cluster_dir / "pgsock"
    data.mkdir(mode=0o700)
    sockets.mkdir()
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        user = "postgres"
        pw = pwd.getpwnam(user)
        for p in (data, sockets):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    init = subprocess.run(
        (["runuser", "-u", user, "--"] if user else [])
        + [_pg_bin("initdb"), "-D", str(data), "-U", "nllab", "--auth=trust", "-E", "UTF8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert init.returncode == 0, init.stdout + init.stderr
    port = free_port()
    pg = start(
        "postgres",
        [_pg_bin("postgres"), "-D", str(data), "-h", HOST, "-p", str(port), "-k", str(sockets)],
        cluster_dir / "logs",
        user=user,
    )
    pg.stop_signal = signal.SIGINT  # "fast" shutdown: does not wait for clients to disconnect
    try:

        def ready() -> bool:
            psycopg2.connect(host=HOST, port=port, user="nllab", dbname="postgres").close()
            return True

        wait_until("PostgreSQL", ready, 60, [pg])
        conn = psycopg2.connect(host=HOST, port=port, user="nllab", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            for db in ("mlflow", "optuna"):
                cur.execute(f"CREATE DATABASE {db}")
        conn.close()
        yield f"postgresql+psycopg2://nllab@{HOST}:{port}"
    finally:
        pg.stop()


@pytest.fixture(scope="module")
def mlflow_server(postgres, cluster_dir) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    srv = start(
        "mlflow",
        [
            str(BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            f"{postgres}/mlflow",
            "--artifacts-destination",
            str(cluster_dir / "artifacts"),
            "--serve-artifacts",
            "--host",
            HOST,
            "--port",
            str(port),
            "--workers",
            "2",
        ],
        cluster_dir / "logs",
        env,
    )
    url = f"http://{HOST}:{port}"
    try:
        wait_until("the MLflow server", lambda: http_ok(f"{url}/health"), 180, [srv])
        yield url
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def prefect_api(cluster_dir) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(cluster_dir / "prefect")}
    env.pop("PREFECT_API_URL", None)
    srv = start(
        "prefect",
        [str(BIN / "prefect"), "server", "start", "--host", HOST, "--port", str(port)],
        cluster_dir / "logs",
        env,
    )
    url = f"http://{HOST}:{port}/api"
    try:
        wait_until("the Prefect server", lambda: http_ok(f"{url}/health"), 180, [srv])
        yield url
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client_env(mlflow_server, prefect_api, cluster_dir) -> dict[str, str]:
    """The environment of every machine of docs/scale-out.md: submitting host and workers."""
    env = dict(os.environ)
    env.update(
        MLFLOW_TRACKING_URI=mlflow_server,
        PREFECT_API_URL=prefect_api,
        PREFECT_HOME=str(cluster_dir / "prefect-client"),
        NLLAB_HOME=str(cluster_dir / "home"),
        NLLAB_EXPERIMENT="cluster",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    for var in ("NLLAB_ARTIFACT_ROOT", "PYTEST_CURRENT_TEST"):
        env.pop(var, None)
    return env


@dataclass
class Dask:
    address: str
    scheduler: Service
    workers: list[Service]


@pytest.fixture(scope="module")
def dask_cluster(client_env, cluster_dir) -> Iterator[Dask]:
    """``dask scheduler`` and two one-thread ``dask worker`` processes (no nanny: a killed
    worker stays dead, as when its machine goes away)."""
    port = free_port()
    logs = cluster_dir / "logs"
    sched = start(
        "dask-scheduler",
        [str(BIN / "dask"), "scheduler", "--host", HOST, "--port", str(port), "--no-dashboard"],
        logs,
        client_env,
    )
    address = f"tcp://{HOST}:{port}"
    services = [sched]
    try:
        wait_until("the Dask scheduler", lambda: port_open(port), 120, services)
        for i in (1, 2):
            services.append(
                start(
                    f"dask-worker-{i}",
                    [
                        str(BIN / "dask"),
                        "worker",
                        address,
                        "--host",
                        HOST,
                        "--nthreads",
                        "1",
                        "--no-nanny",
                        "--no-dashboard",
                        "--memory-limit",
                        "0",
                        "--name",
                        f"w{i}",
                        "--local-directory",
                        str(cluster_dir / f"dask-w{i}"),
                    ],
                    logs,
                    client_env,
                )
            )
        from distributed import Client

        with Client(address, timeout=60) as c:
            c.wait_for_workers(2, timeout=180)
        yield Dask(address, sched, services[1:])
    finally:
        for s in reversed(services):
            s.stop()


# -- commands and queries ------------------------------------------------------------------------
def nllab(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    out = open(log, "wb")  # closed by the caller through finish()
    return subprocess.Popen(
        [str(BIN / "nllab"), *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, log: Path, timeout: float) -> str:
    """Wait for ``proc`` (its process group is killed past ``timeout``) and return its output."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        pytest.fail(f"{proc.args} did not finish within {timeout:.0f} s\n" + log.read_text())
    finally:
        if proc.stdout:
            proc.stdout.close()
    return log.read_text(errors="replace")


def benchmark_args(seed: int, address: str, epochs: int | None = None) -> list[str]:
    args = ["benchmark", "--profile", "smoke", "--systems", *SYSTEMS, "--methods", *METHODS]
    args += ["--seeds", str(seed), "--device", "cpu", "--no-progress", "--no-register"]
    args += ["--task-runner", "dask", "--dask-address", address, "--max-workers", "2"]
    if epochs is not None:
        args += ["--epochs", str(epochs)]
    return args


def cell_runs(tracking_uri: str, seed: int, status: str | None = None) -> list:
    """Cell runs of ``seed`` in the ``cluster`` experiment, read through the server's REST API."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("cluster")
    if exp is None:
        return []
    query = f"tags.`nllab.kind` = 'cell' and tags.seed = '{seed}'"
    if status:
        query += f" and attributes.status = '{status}'"
    return list(client.search_runs([exp.experiment_id], query, max_results=1000))


def prefect_completed(api: str, what: str) -> list[str]:
    """Names of the COMPLETED flow runs or task runs (``what``) recorded by the Prefect server."""
    body = {what: {"state": {"type": {"any_": ["COMPLETED"]}}}, "limit": 200}
    req = urllib.request.Request(
        f"{api}/{what}/filter",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return [run["name"] for run in json.load(r)]


def expected_hashes(seed: int, epochs: int | None = None) -> set[str]:
    """Config hashes of the benchmark's cells, computed here, independently of the servers."""
    from tasks.config import resolve_config

    overrides = {"systems": list(SYSTEMS), "methods": list(METHODS), "seeds": [seed]}
    overrides["device"] = "cpu"
    if epochs is not None:
        overrides["training"] = {"epochs": epochs}
    return {c.config_hash() for c in resolve_config("smoke", overrides=overrides).cells()}


def assert_one_finished_run_per_cell(tracking_uri: str, seed: int, epochs: int | None) -> None:
    finished = cell_runs(tracking_uri, seed, "FINISHED")
    counts = Counter(r.data.tags["config_hash"] for r in finished)
    assert set(counts) == expected_hashes(seed, epochs), counts
    assert all(n == 1 for n in counts.values()), f"a cell FINISHED twice: {counts}"
    for r in finished:
        assert r.data.metrics["test_rmse"] > 0, r.data.tags


# -- tests ---------------------------------------------------------------------------------------
def test_benchmark_on_the_cluster_lands_every_cell_in_the_mlflow_server(
    dask_cluster, client_env, mlflow_server, prefect_api, cluster_dir
):
    log = cluster_dir / "logs" / "benchmark-seed0.log"
    proc = nllab(benchmark_args(0, dask_cluster.address), client_env, log)
    out = finish(proc, log, 600)
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert_one_finished_run_per_cell(mlflow_server, 0, None)
    # Every cell ran on a worker process, and its child run hangs off one parent in the server.
    parents = {r.data.tags["mlflow.parentRunId"] for r in cell_runs(mlflow_server, 0)}
    assert len(parents) == 1
    # The rerun finds them all through the server and trains nothing: no flow run, no new runs.
    log = cluster_dir / "logs" / "benchmark-seed0-rerun.log"
    out = finish(nllab(benchmark_args(0, dask_cluster.address), client_env, log), log, 600)
    assert "4 cells: 0 finished, 4 reused" in out, out
    assert len(cell_runs(mlflow_server, 0)) == 4
    # The flow run, and the cell task runs the workers reported, are in the Prefect server.
    assert len(prefect_completed(prefect_api, "flow_runs")) == 1
    cells = {f"{s}/{m}/seed0" for s in SYSTEMS for m in METHODS}
    assert cells <= set(prefect_completed(prefect_api, "task_runs"))


def test_kill_9_of_a_worker_mid_cell_loses_nothing(
    dask_cluster, client_env, mlflow_server, cluster_dir
):
    epochs = 30  # long enough cells that the kill lands inside one
    log = cluster_dir / "logs" / "benchmark-seed1.log"
    proc = nllab(benchmark_args(1, dask_cluster.address, epochs), client_env, log)
    try:
        # Both workers are inside a cell once two cell runs are RUNNING (one thread each).
        wait_until(
            "two running cells",
            lambda: len(cell_runs(mlflow_server, 1, "RUNNING")) >= 2,
            300,
            [dask_cluster.scheduler, *dask_cluster.workers],
        )
        assert proc.poll() is None, log.read_text()
        dask_cluster.workers[0].kill9()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    out = finish(proc, log, 900)
    assert proc.returncode == 0, out
    assert dask_cluster.workers[1].proc.poll() is None, dask_cluster.workers[1].tail()
    assert_one_finished_run_per_cell(mlflow_server, 1, epochs)
    # The killed cell's run is left behind unfinished; it never counts as a result, and the next
    # process to connect ends it KILLED, so none stays RUNNING.
    assert len(cell_runs(mlflow_server, 1)) > 4, out
    connect = "from tasks.tracking import connect; print(connect().claims.end_stale_runs())"
    subprocess.run([sys.executable, "-c", connect], env=client_env, check=True, timeout=120)
    assert not cell_runs(mlflow_server, 1, "RUNNING")
    assert cell_runs(mlflow_server, 1, "KILLED")


STUDY_TRIALS = 4


def test_processes_opening_a_fresh_optuna_database_together_all_succeed(
    postgres, open_storage_at_once
):
    """PostgreSQL's CREATE TABLE races between sessions; the losers must retry, not fail."""
    import psycopg2

    port = int(postgres.rsplit(":", 1)[1])
    for k in range(3):  # a race is won by chance: a few fresh databases
        conn = psycopg2.connect(host=HOST, port=port, user="nllab", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE optuna_race_{k}")
        conn.close()
        errors = open_storage_at_once(f"{postgres}/optuna_race_{k}")
        assert not errors, errors


@pytest.fixture(scope="module")
def two_tuners(postgres, client_env, cluster_dir):
    """Two ``nllab tune`` processes started together on one study in PostgreSQL."""
    storage = f"{postgres}/optuna"
    args = ["tune", "--method", "node", "--system", "spiral_dde", "--profile", "smoke"]
    args += ["--trials", str(STUDY_TRIALS), "--storage", storage, "--study-name", "shared"]
    procs = [(nllab(args, client_env, cluster_dir / "logs" / f"tune-{i}.log"), i) for i in (1, 2)]
    try:
        outs = [finish(p, cluster_dir / "logs" / f"tune-{i}.log", 600) for p, i in procs]
    finally:
        for p, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    import optuna

    study = optuna.load_study(study_name="shared", storage=storage)
    return [p.returncode for p, _ in procs], outs, study.get_trials(deepcopy=False)


def test_two_tune_processes_share_one_study_in_postgres(two_tuners):
    from optuna.trial import TrialState

    codes, outs, trials = two_tuners
    assert codes == [0, 0], "\n\n".join(f"exit {c}:\n{o[-4000:]}" for c, o in zip(codes, outs))
    states = Counter(t.state for t in trials)
    # Every trial ended (none left RUNNING), and both processes reported on the one study.
    assert states[TrialState.RUNNING] == 0, states
    assert states[TrialState.COMPLETE] + states[TrialState.PRUNED] >= STUDY_TRIALS, states
    for out in outs:
        assert "study shared:" in out, out


def test_two_tune_processes_end_at_the_study_trial_count(two_tuners):
    from optuna.trial import TrialState

    _, _, trials = two_tuners
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(done) == STUDY_TRIALS, Counter(t.state for t in trials)
