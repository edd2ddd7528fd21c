"""A numerics fingerprint's cache key covers every file that can move a number, by what it is:
the packages ``nltrain``, ``nlmodels`` and ``datasets`` whole, and a plugin model's whole
package. Shown on a shadow copy of the tree, first on ``sys.path`` in a child process: an edit to
each covered file changes the key, an edit to the command line or the report does not; and a
benchmark whose training loop was edited retrains its cell instead of reusing it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import nltrain.numerics

ROOT = Path(__file__).resolve().parents[1]
#: Modules that cannot move a number: the command line's and the reports'.
NOT_NUMERIC = sorted(
    [
        *(p.relative_to(ROOT).as_posix() for p in (ROOT / "flows" / "cli").glob("*.py")),
        "flows/reports/report_full.py",
        "tasks/reports/reporting.py",
    ]
)
#: A plugin model in a package of its own; its arithmetic is in another module of the package.
PLUGIN = {
    "toyplug/__init__.py": """
        import torch
        from torch import nn

        from nlmodels import ForecastModel, register_model
        from toyplug._maths import shift


        @register_model("toy_plug")
        class ToyPlug(ForecastModel):
            def __init__(self, state_dim: int) -> None:
                super().__init__()
                self.net = nn.Linear(state_dim, state_dim)

            def forward(self, obs_t, obs_x, query_t):
                return shift(self.net(obs_x[:, -1:, :]).expand(-1, query_t.shape[-1], -1))
        """,
    "toyplug/_maths.py": """
        def shift(x):
            return x + 1.0
        """,
}
#: The child: the key before, then after appending a comment to each file in turn (restored).
CHILD = """
import json, sys
from pathlib import Path

root = Path(sys.argv[1])
import nltrain.numerics, toyplug  # noqa: E401  (toyplug registers toy_plug)

assert Path(nltrain.__file__).is_relative_to(root), nltrain.__file__
comment = {".c": b"\\n/* edited */\\n", ".h": b"\\n/* edited */\\n", ".json": b"\\n"}
out = {"covered": sorted(nltrain.numerics.covered_sources()), "changed": {}, "plugin": {}}


def edited(rel, method=None):
    path = root / rel
    before = nltrain.numerics.source_key(method)
    original = path.read_bytes()
    path.write_bytes(original + comment.get(path.suffix, b"\\n# edited\\n"))
    try:
        return nltrain.numerics.source_key(method) != before
    finally:
        path.write_bytes(original)


for rel in json.loads(sys.argv[2]):
    out["changed"][rel] = edited(rel)
out["plugin"] = {
    "covered": sorted(
        n for n in nltrain.numerics.covered_sources("toy_plug") if n.startswith("toyplug")
    ),
    "its key": edited("toyplug/_maths.py", "toy_plug"),
    "the floors' key": edited("toyplug/_maths.py"),
}
print(json.dumps(out))
"""


def _numeric_files() -> list[str]:
    """Every source and data file of the numeric packages, by walking them (a module added
    later is here without touching this test)."""
    return sorted(
        p.relative_to(ROOT).as_posix()
        for package in nltrain.numerics.NUMERIC_PACKAGES
        for p in (ROOT / package).rglob("*")
        if p.is_file() and p.suffix in (".py", ".c", ".h", ".json") and "__pycache__" not in p.parts
    )


def _shadow(tmp_path: Path) -> Path:
    """A copy of the tree's packages (and the plugin package) to put first on ``sys.path``."""
    shadow = tmp_path / "shadow"
    for package in ("nlmodels", "datasets", "nltrain", "tasks", "flows"):
        shutil.copytree(
            ROOT / package, shadow / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for rel, source in PLUGIN.items():
        (shadow / rel).parent.mkdir(parents=True, exist_ok=True)
        (shadow / rel).write_text(textwrap.dedent(source))
    return shadow


def _child_env(shadow: Path | None, home: Path | None = None) -> dict[str, str]:
    """The environment of a child that imports the shadow (or the tree) and, given ``home``,
    keeps everything there (the embedded MLflow store, Prefect's home, the numerics cache)."""
    env = {**os.environ, "PYTHONPATH": str(shadow or ROOT)}
    if home is not None:
        env["NLLAB_HOME"] = str(home)
        env["NLLAB_INSTALL_CACHE"] = str(home / "installation")
        for var in (
            "MLFLOW_TRACKING_URI",
            "NLLAB_ARTIFACT_ROOT",
            "PREFECT_HOME",
            "PREFECT_API_URL",
        ):
            env.pop(var, None)
    return env


def test_the_covered_files_are_the_numeric_packages_whole():
    covered = nltrain.numerics.covered_sources()
    paths = {p.resolve().relative_to(ROOT).as_posix() for p in covered.values()}
    assert set(_numeric_files()) <= paths
    assert {p.split("/")[0] for p in paths} == set(nltrain.numerics.NUMERIC_PACKAGES)
    # the name a file is hashed under does not depend on where the tree lies
    assert all(covered[name].as_posix().endswith(name) for name in covered)


def test_an_edit_to_each_covered_file_changes_the_key_and_to_the_cli_or_report_not(tmp_path):
    shadow = _shadow(tmp_path)
    files = _numeric_files()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(shadow), json.dumps(files + NOT_NUMERIC)],
        env=_child_env(shadow),
        cwd=shadow,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(files) <= set(found["covered"])
    assert [f for f in files if not found["changed"][f]] == []
    assert {f: found["changed"][f] for f in NOT_NUMERIC} == dict.fromkeys(NOT_NUMERIC, False)
    # a plugin's whole package: an edit to a module of it changes its model's key only
    assert found["plugin"] == {
        "covered": ["toyplug/__init__.py", "toyplug/_maths.py"],
        "its key": True,
        "the floors' key": False,
    }


#: The training loop's batches; the edit skips the last batch of every epoch.
LOOP_BATCHES = "for b_i, start in enumerate(range(0, n_train, bs)):"
SKIP_LAST = "for b_i, start in list(enumerate(range(0, n_train, bs)))[:-1]:"


@pytest.mark.slow
def test_a_cell_is_reused_after_a_cli_edit_and_retrained_after_a_loop_edit(tmp_path):
    """The end-to-end case: a smoke cell trained; the same command from a shadow copy whose
    ``flows/cli`` modules were edited reuses it; with ``nltrain``'s loop edited there (the last
    batch of every epoch skipped), it is retrained (its model's fingerprint differs)."""
    home = tmp_path / "home"
    command = ["-m", "flows.cli", "benchmark", "--profile", "smoke", "--no-progress"]
    command += ["--systems", "integro_de", "--methods", "node", "--seeds", "0", "--epochs", "2"]

    def benchmark(shadow: Path | None) -> str:
        out = subprocess.run(
            [sys.executable, *command],
            env=_child_env(shadow, home),
            cwd=shadow or ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout + out.stderr

    assert "1 cells: 1 finished, 0 reused" in benchmark(None)
    shadow = _shadow(tmp_path)
    for cli in (shadow / "flows" / "cli").glob("*.py"):
        cli.write_text(cli.read_text() + "\n# edited\n")
    assert "1 cells: 0 finished, 1 reused" in benchmark(shadow)
    loop = shadow / "nltrain" / "_loop.py"
    assert LOOP_BATCHES in loop.read_text()
    loop.write_text(loop.read_text().replace(LOOP_BATCHES, SKIP_LAST))
    retrained = benchmark(shadow)
    assert "1 cells: 1 finished, 0 reused" in retrained
    assert "node changed since commit" in retrained
