"""The fast tier (``make test-fast``): which tests start processes is read from each test
module's imports and each test's fixtures (tests/conftest.py), and the tier leaves out every
marked kind."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from types import SimpleNamespace

from conftest import starts_processes

ROOT = Path(__file__).resolve().parents[1]


def _item(path: Path, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(path=path, fixturenames=["request", *fixtures])


def test_a_test_starts_processes_by_its_modules_imports_or_its_fixtures(tmp_path):
    modules = {
        "unit": "import math\nfrom nlmodels import build_model\n",
        "spawns": "def test_one():\n    import subprocess\n",  # inside a test counts too
        "drives_the_cli": "from flows.cli import main\n",
        "runs_a_flow": "from prefect import flow\n",
        "by_name": "import importlib\nimportlib.import_module('benchmarks.cold_start')\n",
    }
    paths = {}
    for name, text in modules.items():
        paths[name] = tmp_path / f"test_{name}.py"
        paths[name].write_text(text)
    assert not starts_processes(_item(paths["unit"], "tmp_path", "monkeypatch"))
    assert starts_processes(_item(paths["unit"], "mlflow_store"))
    assert starts_processes(_item(paths["unit"], "prefect_api"))
    assert all(starts_processes(_item(paths[n])) for n in modules if n != "unit")


def test_the_suites_own_modules_are_sorted_so():
    tests = ROOT / "tests"
    assert starts_processes(_item(tests / "test_cli.py"))
    assert starts_processes(_item(tests / "test_cold_start.py"))
    assert not starts_processes(_item(tests / "test_ilt.py"))


def test_the_fast_tier_leaves_out_every_marked_kind():
    lines = (ROOT / "Makefile").read_text().splitlines()
    words = shlex.split(lines[lines.index("test-fast: $(STAMP)") + 1])
    expression = words[len(words) - words[::-1].index("-m")]  # (the last -m: after pytest)
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    markers = {m.split(":")[0] for m in pytest_options["ini_options"]["markers"]}
    assert sorted(expression.split(" and ")) == sorted(f"not {m}" for m in markers)
    assert markers >= {"slow", "gpu", "cluster", "process", "training", "simulation"}
