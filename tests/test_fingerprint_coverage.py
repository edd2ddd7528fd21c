"""The numerics canaries run every code path the paper profile's cells run, measured.

A fingerprint (:mod:`nltrain._fingerprints`) can only notice an edit of code its canary runs.
Which code a cell runs depends on the cell (its model's settings, its system's state dimension,
its batch sizes, its split), so instead of trusting a list of those, these tests trace a real
cell of every model the paper profile and the ledger's ablation build, on every system, and
compare the lines it runs with the lines its canary runs:

* Python: every line of ``nltrain``, ``nlmodels`` and ``datasets`` (``sys.settrace``);
* C: every line of the native kernels (a ``--coverage`` build of them, read by gcov), which
  branch on sizes (register blocks of 1, 2 or 4 rows, 32-column blocks, masked tails);
  ``-m slow``, a few minutes.

A real cell here is today's paper-profile cell with one epoch: its data at full size, its
model as the profile builds it, its training protocol, its forecast of the test split.
"""

from __future__ import annotations

import json
import linecache
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "nlmodels" / "accel" / "native" / "kernels.c"


def _paper_cells() -> list:
    """Seed 0 of every cell of the ledger (the paper profile's and its ablations')."""
    from tasks.ledger_scope import ledger_cell_configs

    return [cell for cell, _ in ledger_cell_configs(seeds=[0])]


def _model_groups() -> dict[tuple[str, str, int], list]:
    """The paper cells by the canary that fingerprints them: (method, settings, state dim)."""
    from tasks.numerics import model_key

    groups: dict[tuple[str, str, int], list] = {}
    for cell in _paper_cells():
        groups.setdefault(model_key(cell), []).append(cell)
    return groups


@contextmanager
def _lines_run(packages: tuple[str, ...]) -> Iterator[set[tuple[str, int]]]:
    """The (file, line) pairs of ``packages`` run inside the block, on every thread."""
    roots = tuple(str(ROOT / p) + os.sep for p in packages)
    lines: set[tuple[str, int]] = set()

    def local(frame, event, arg):
        if event == "line":
            lines.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(roots) else None

    before = sys.gettrace()
    sys.settrace(calls)
    threading.settrace(calls)
    try:
        yield lines
    finally:
        sys.settrace(before)
        threading.settrace(None)


def _missing(real: set, canary: set) -> list[str]:
    return [
        f"{Path(f).relative_to(ROOT)}:{n}: {linecache.getline(f, n).strip()}"
        for f, n in sorted(real - canary)
    ]


def _packs(cells: list) -> list[list]:
    """``cells`` in the packs the engine trains them in (outside a trace: the registry's
    lookups that decide it compute nothing)."""
    from tasks.engine import make_packs

    return make_packs(cells, True)


def _train_real(packs: list[list]) -> None:
    """Each of ``packs`` trained as the engine trains it, one epoch, and its test forecasts."""
    from nltrain import LoopOptions, predict, train_packed
    from tasks.pipeline import build_cell_model, prepare_cell, simulate_data

    for pack in packs:
        prepared = [prepare_cell(c, simulate_data(c.system, c.data, c.seed)) for c in pack]
        models = [
            build_cell_model(c, int(p.train.obs_x.shape[-1]))[0]
            for c, p in zip(pack, prepared, strict=True)
        ]
        train_packed(
            models,
            [p.train for p in prepared],
            [p.val for p in prepared],
            pack[0].training.model_copy(update={"epochs": 1}),
            device="cpu",
            seeds=[c.seed for c in pack],
            options=LoopOptions(labels=tuple(c.key for c in pack)),
            pack=len(pack) > 1,
        )
        for model, p in zip(models, prepared, strict=True):
            predict(model, p.test)


def _run_canary(key: tuple[str, str, int]) -> None:
    import hashlib

    from nltrain import _fingerprints

    method, settings, state_dim = key
    _fingerprints._train_canary(method, hashlib.sha256(), json.loads(settings), state_dim)


GROUPS = _model_groups()


@pytest.mark.parametrize("key", sorted(GROUPS), ids=lambda k: f"{k[0]}{k[1]}-{k[2]}d")
def test_a_models_canary_runs_every_python_line_its_paper_cells_run(key):
    packs = _packs(GROUPS[key])
    _train_real([packs[0][:1]])  # once untraced: the imports a first cell pays are not the cells'
    with _lines_run(("nltrain", "nlmodels")) as canary:  # first: checks done once per process
        _run_canary(key)
    with _lines_run(("nltrain", "nlmodels")) as real:
        _train_real(packs)
    assert not _missing(real, canary), "\n".join(_missing(real, canary))


def _data_cells() -> list:
    """One paper cell per system, and each with a sub-sample of its training trajectories (as
    the sample-size study trains: ``n_train``)."""
    cells = [c for c in _paper_cells() if c.method == "node"]
    sub = [c.model_copy(update={"data": c.data.model_copy(update={"n_train": 24})}) for c in cells]
    return cells + sub


@pytest.mark.parametrize(
    "cell", _data_cells(), ids=lambda c: c.system + ("" if c.data.n_train is None else "-n_train")
)
def test_a_systems_canary_runs_every_python_line_its_paper_cells_data_run(cell):
    """The data of a cell (simulated, then split as the cell splits it; the on-disk cache
    stores simulate's arrays bitwise) and its system's canary."""
    from datasets import simulate
    from nltrain import _fingerprints
    from tasks.pipeline import prepare_cell

    d = cell.data
    with _lines_run(("datasets",)) as real:
        ds = simulate(cell.system, d.n_trajectories, d.n_points, cell.seed, d.noise_std)
        prepare_cell(cell, ds)
    split = _fingerprints._split_settings(d.normalise_on, d.n_train is not None)
    with _lines_run(("datasets",)) as canary:
        _fingerprints._system_canary(cell.system, split)
    assert not _missing(real, canary), "\n".join(_missing(real, canary))


#: The child that runs, in a process of its own, either every canary or every real cell of
#: GROUPS with a coverage build of the native kernels (gcov writes its counts at exit).
_CHILD = """
import sys
sys.path.insert(0, {tests!r})
from nlmodels import set_up_numerics, native_cpu_kernels
set_up_numerics()
import test_fingerprint_coverage as t
assert native_cpu_kernels(), "the native kernels did not load"
for key, cells in sorted(t.GROUPS.items()):
    t._run_canary(key) if sys.argv[1] == "canary" else t._train_real(t._packs(cells))
"""


def _gcov_lines(build: Path) -> set[int]:
    """Lines of kernels.c that ran (gcov's count is a number, not ``#####`` or ``-``)."""
    (gcda,) = build.glob("*.gcda")
    out = subprocess.run(
        ["gcov", "-t", "-o", str(gcda), str(KERNELS)],
        cwd=build, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    ran = set()
    for line in out.splitlines():
        count, _, rest = line.partition(":")
        number = rest.partition(":")[0].strip()
        if count.strip().rstrip("*").isdigit() and number.isdigit():
            ran.add(int(number))
    return ran


def _native_lines(part: str, build: Path, env: dict[str, str]) -> set[int]:
    for stale in build.glob("*.gcda"):
        stale.unlink()
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(tests=str(ROOT / "tests")), part],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    return _gcov_lines(build)


@pytest.mark.slow  # a few minutes: every paper cell's epoch with unoptimised kernels
@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("gcov")), reason="needs gcc and gcov")
def test_the_canaries_run_every_native_kernel_line_the_paper_cells_run(tmp_path):
    from nlmodels.accel import native

    if not native.usable():
        pytest.skip("the native kernels do not build on this machine")
    cc = tmp_path / "cc-coverage"
    cc.write_text('#!/bin/sh\nexec gcc "$@" --coverage -O0\n')  # -O0: lines map to code
    cc.chmod(0o755)
    build = tmp_path / "native"
    build.mkdir(mode=0o700)
    env = {
        **os.environ,
        "CC": str(cc),
        "NLLAB_NATIVE": "1",
        "NLLAB_NATIVE_CACHE": str(build),
        "NLLAB_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(ROOT),
    }
    canary, real = (_native_lines(part, build, env) for part in ("canary", "real"))
    lines = KERNELS.read_text().splitlines()
    missing = [f"kernels.c:{n}: {lines[n - 1].strip()}" for n in sorted(real - canary)]
    assert real and not missing, "\n".join(missing)
