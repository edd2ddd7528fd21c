"""Shared test setup: an isolated data folder and MLflow store, offline, before anything imports
mlflow or prefect; a session-wide Prefect test server for flow tests; the ``process`` marker on
the tests that start processes, drive the command line or use a store or a server."""

from __future__ import annotations

import ast
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Module level on purpose: these must hold before tasks/flows (and so mlflow/prefect) are imported.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="nllab-test-home-"))
os.environ["NLLAB_HOME"] = str(_SESSION_HOME)
os.environ["PREFECT_HOME"] = str(_SESSION_HOME / "prefect")
# the installation's numerics cache too: a fingerprint computed under a test's patched code
# must not outlive the run (child processes that set a home of their own inherit it). One per
# run, made by its first process (pytest, or pytest-xdist's controller, whose environment its
# workers inherit) and shared by the workers: each would otherwise compute the numerics
# canaries of the ledger's scope, a minute or more, for itself. Its maker removes it.
_RUN_INSTALLATION_VAR = "NLLAB_TEST_RUN_INSTALLATION"
os.environ.setdefault(_RUN_INSTALLATION_VAR, str(_SESSION_HOME / "installation"))
os.environ["NLLAB_INSTALL_CACHE"] = os.environ[_RUN_INSTALLATION_VAR]
for _var in ("MLFLOW_TRACKING_URI", "NLLAB_ARTIFACT_ROOT", "NLLAB_EXPERIMENT", "PREFECT_API_URL"):
    os.environ.pop(_var, None)
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["DO_NOT_TRACK"] = "true"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"

# Prefect binds its console log handler to sys.stderr when it is first imported. The command line
# imports it only when a command runs, which in a test is under pytest's output capture: the
# handler would keep writing to that test's closed stream. Import it here, outside any capture.
import prefect.main  # noqa: E402, F401  (sets up Prefect's logging)

# The CPU numerics mode before any test module computes with torch (as every entry point does).
import nlmodels  # noqa: E402

nlmodels.set_up_numerics()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


#: What MLflow's ``set_tracking_uri``/``set_registry_uri`` write into the environment (for child
#: processes to inherit): a command run in-process leaves them set, and a later test of the same
#: worker would find its store instead of the embedded one of its own home.
_MLFLOW_URIS = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@pytest.fixture(autouse=True)
def _mlflow_uris_kept():
    """Each test ends with the environment's MLflow URIs as it began (after its monkeypatch)."""
    before = {var: os.environ.get(var) for var in _MLFLOW_URIS}
    yield
    for var, value in before.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


@pytest.fixture(autouse=True)
def _niceness_kept():
    """A test that lowers this process's priority (``ledger run`` called in-process) puts it
    back: a worker left niced runs every later test of its session starved by the other one.
    Fails such a test where the niceness could be put back (so the code could have), and puts
    it back; where a process may not lower its niceness, nothing can be done or checked."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    yield
    after = os.getpriority(os.PRIO_PROCESS, 0)
    if after != before:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, before)
        except OSError:
            return
        pytest.fail(f"the test left this process's niceness at {after} (it was {before})")


#: A test module that imports one of these starts processes (``subprocess``,
#: ``multiprocessing``, the engine's worker processes, the timed runs of ``benchmarks/``),
#: drives the command line (``flows.cli``), runs Prefect flows (which start a temporary server)
#: or a browser: each of its tests is marked ``process``.
PROCESS_IMPORTS = (
    "subprocess",
    "multiprocessing",
    "tasks.machine.workers",
    "benchmarks",
    "flows.cli",
    "prefect",
    "playwright",
)
#: A test that uses one of these fixtures (an MLflow store, the Prefect server) is too.
PROCESS_FIXTURES = frozenset(
    {"mlflow_store", "module_mlflow_store", "point_mlflow_at", "prefect_server", "prefect_api"}
)


def _imports_by_name(node: ast.AST) -> bool:
    """Whether ``node`` is a call ``import_module("a.name")`` (its name a string)."""
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


@functools.cache
def _imports(path: Path) -> frozenset[str]:
    """The modules the file ``path`` imports (at its top or inside a function), with the
    packages above them: ``from flows.cli import main`` gives flows, flows.cli, flows.cli.main."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            full = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            full = [f"{node.module}.{a.name}" for a in node.names]
        elif _imports_by_name(node):  # importlib.import_module("benchmarks.cold_start")
            full = [node.args[0].value]
        else:
            continue
        for name in full:
            parts = name.split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(names)


def starts_processes(item: pytest.Item) -> bool:
    """Whether ``item`` is a test of the ``process`` tier: see :data:`PROCESS_IMPORTS` and
    :data:`PROCESS_FIXTURES`."""
    fixtures = set(getattr(item, "fixturenames", ()))
    return bool(fixtures & PROCESS_FIXTURES) or bool(
        _imports(Path(item.path)) & set(PROCESS_IMPORTS)
    )


#: Each test module's seconds in a timed run (``scripts/module_seconds.py`` writes it from the
#: run's JUnit report). The modules are handed out longest first, so that the last module a
#: pytest-xdist worker takes is a short one and the two finish together (the
#: longest-processing-time rule; xdist's own order, most tests first, left a long module last).
_MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # (pytest-xdist's, in its controller)
        config.option.loadscopereorder = False  # the collection's order: ours, below


@functools.cache
def _module_seconds() -> dict[str, float]:
    try:
        return json.loads(_MODULE_SECONDS.read_text())
    except (OSError, ValueError):
        return {}


def _longest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` by their module's recorded seconds, longest first (a module not recorded,
    a new one, first of all), keeping each module's own order."""
    seconds = _module_seconds()
    root = Path(__file__).resolve().parent.parent

    def key(item: pytest.Item) -> float:
        module = Path(item.path).resolve()
        name = module.relative_to(root).as_posix() if module.is_relative_to(root) else str(module)
        return -seconds.get(name, float("inf"))

    items.sort(key=key)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by marker (-m)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if starts_processes(item):
            item.add_marker(pytest.mark.process)
    _longest_first(items)


def _point_mlflow_at(mp: pytest.MonkeyPatch, folder: Path) -> Path:
    """Make ``folder`` the sqlite MLflow store and artifact root (via the environment)."""
    folder.mkdir(parents=True, exist_ok=True)
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    mp.setenv("NLLAB_ARTIFACT_ROOT", str(folder / "artifacts"))
    return folder


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> Path:
    """A fresh sqlite MLflow store and artifact folder for one test."""
    return _point_mlflow_at(monkeypatch, tmp_path / "mlflow")


@pytest.fixture
def point_mlflow_at(monkeypatch):
    """``point_mlflow_at(folder)``: switch this test to the store in ``folder``."""
    return lambda folder: _point_mlflow_at(monkeypatch, folder)


def _open_storage_at_once(url: str, openers: int = 4) -> list[str]:
    """Open the Optuna storage ``url`` from ``openers`` threads released together; the errors."""
    import threading

    from tasks.tuning import open_storage

    start_together = threading.Barrier(openers)
    errors: list[str] = []

    def open_one() -> None:
        start_together.wait()
        try:
            open_storage(url).engine.dispose()
        except Exception as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=open_one) for _ in range(openers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.fixture
def open_storage_at_once():
    """``open_storage_at_once(url, openers=4)``: the errors of opening ``url`` from several
    threads at once (the race of processes that create one fresh storage's tables)."""
    return _open_storage_at_once


@pytest.fixture(scope="module")
def module_mlflow_store(tmp_path_factory) -> Iterator[Path]:
    """One store shared by every test of a module (cells trained once, checked many times)."""
    with pytest.MonkeyPatch.context() as mp:
        yield _point_mlflow_at(mp, tmp_path_factory.mktemp("mlflow"))


@pytest.fixture(scope="session")
def prefect_server():
    """One temporary Prefect API for every flow test of the session (~10 s to start), given as
    long as a command's own temporary server, which grows with the machine's load (a fixed 60 s
    against the 16-26 s its start took at load 8-12 on 2 cores)."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.runtime.prefect_server import startup_timeout

    with prefect_test_harness(server_startup_timeout=round(startup_timeout())):
        yield


@pytest.fixture
def prefect_api(prefect_server) -> str:
    """The session's Prefect server's URL, for a subprocess's ``PREFECT_API_URL``: an ``nllab``
    command run by a test then starts no temporary server of its own (~8 s each). The temporary
    server's own start, notice and timeout are checked by tests/test_environment.py and
    tests/test_store_faults.py, which leave ``PREFECT_API_URL`` unset."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def _declared_systems_forgotten() -> Iterator[None]:
    """The process's registry of systems as it was before, once the caller is done (a
    config's ``define_systems`` and a plugin simulator named in it declare theirs there)."""
    from datasets import _systems
    from tasks.config import declarations as _declarations

    tables = (_systems.SYSTEM_SPECS, _systems._INFOS, _declarations._DECLARED)
    before = [dict(table) for table in tables]
    yield
    for table, saved in zip(tables, before, strict=True):
        table.clear()
        table.update(saved)


@pytest.fixture
def forget_declared_systems():
    """Systems a test declares leave the process's registry afterwards (other tests list the
    built-in ones)."""
    yield from _declared_systems_forgotten()


@pytest.fixture(scope="module", autouse=True)
def _declared_systems_stay_in_their_module():
    """Whatever a module's tests declare leaves with the module: the modules run in any order,
    and a later one may list the built-in systems."""
    yield from _declared_systems_forgotten()


def _fake_distribution(site: Path, package: str, group: str, entries: dict[str, str]) -> Path:
    info = site / f"{package.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")
    return site


@pytest.fixture
def fake_distribution():
    """``fake_distribution(site, package, group, {name: value})``: an installed package with
    entry points, as ``pip install`` leaves its ``.dist-info`` in ``site`` (put ``site`` on
    ``sys.path`` to install it)."""
    return _fake_distribution
