"""The numerics canaries run every code path the paper profile's cells run, measured.

A fingerprint (:mod:`nltrain.numerics._fingerprints`) can only notice an edit of code its canary
runs. Which code a cell runs depends on the cell (its model's settings, its system's state
dimension,
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

# Every test here traces real paper cells: CI runs them (`make test-heavy`), `make test` does not.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "nlmodels" / "accel" / "native" / "kernels.c"


def _paper_cells() -> list:
    """Seed 0 of every cell of the ledger (the paper profile's and its ablations')."""
    from tasks.ledger.scope import ledger_cell_configs

    return [cell for cell, _ in ledger_cell_configs(seeds=[0])]


def _model_groups() -> dict[tuple[str, str, int], list]:
    """The paper cells by the canary that fingerprints them: (method, settings, state dim)."""
    from tasks.machine.numerics import model_key

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


def _run_canary(key: tuple[str, str, int, str]) -> None:
    import hashlib

    from nltrain.numerics import _fingerprints

    method, settings, state_dim, protocol = key
    _fingerprints._train_canary(
        method, hashlib.sha256(), json.loads(settings), state_dim, json.loads(protocol)
    )


GROUPS = _model_groups()


@pytest.mark.parametrize("key", sorted(GROUPS), ids=lambda k: f"{k[0]}{k[1]}{k[3]}-{k[2]}d")
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
    the sample-size study trains: ``n_train``); one with noise after the z-score (as the noise
    study trains at the paper's budget: ``noise_on``)."""
    cells = [c for c in _paper_cells() if c.method == "node"]
    sub = [c.model_copy(update={"data": c.data.model_copy(update={"n_train": 24})}) for c in cells]
    after = {"noise_std": 0.1, "noise_on": "normalised"}
    noisy = [c.model_copy(update={"data": c.data.model_copy(update=after)}) for c in cells[:1]]
    return cells + sub + noisy


def _data_id(cell) -> str:
    return (
        cell.system
        + ("" if cell.data.n_train is None else "-n_train")
        + ("-noise_on" if cell.data.noise_effective else "")
    )


@pytest.mark.parametrize("cell", _data_cells(), ids=_data_id)
def test_a_systems_canary_runs_every_python_line_its_paper_cells_data_run(cell):
    """The data of a cell (simulated, then split as the cell splits it; the on-disk cache
    stores simulate's arrays bitwise) and its system's canary."""
    _check_data(cell)


def _check_data(cell) -> None:
    from datasets import simulate
    from nltrain.numerics import _fingerprints, canary_split
    from tasks.machine.numerics import data_settings
    from tasks.pipeline import prepare_cell

    d = cell.data
    with _lines_run(("datasets",)) as real:
        ds = simulate(cell.system, d.n_trajectories, d.n_points, cell.seed, d.noise_std, d.noise_on)
        prepare_cell(cell, ds)
    with _lines_run(("datasets",)) as canary:
        _fingerprints._system_canary(cell.system, canary_split(data_settings(cell)))
    assert not _missing(real, canary), "\n".join(_missing(real, canary))


# -- cells nobody listed: every setting of a cell changed, one at a time ------------------------
#: A variant's real cell trains on this many trajectories (the paper's sizes are the groups'
#: tests' above; a variant changes one setting, not the sizes).
_VARIANT_TRAJECTORIES = 60


def _other_values(annotation, default, bounds: dict[str, float]) -> list:
    """Values of a setting other than its ``default``, from its type alone: each other choice
    of a ``Literal``, the other of a bool, ``None`` for an optional setting that has a value
    and a value for one that has none (its lower bound, or 1000 past an open one), a number
    doubled (1 for zero), a tuple reversed, a sequence one item longer."""
    import types
    import typing
    from collections.abc import Sequence

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return [a for a in args if a != default]
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        if default is not None:
            return [None, *_other_values(inner, default, bounds)]
        if inner in (int, float):
            return [inner(bounds["ge"]) if "ge" in bounds else inner(bounds.get("gt", 0) + 1000)]
        return []
    if annotation is bool:
        return [not default]
    if annotation in (int, float):
        return [annotation(default * 2) if default else annotation(1)]
    if origin is tuple and default:
        return [tuple(reversed(default))] if tuple(reversed(default)) != default else []
    if origin in (Sequence, list) and default:
        return [(*default, default[-1])]
    return []


def _field_variants(settings, skip: set[str]) -> list[tuple[str, object]]:
    """(field, value) for every value other than its own of every field of pydantic
    ``settings`` (but ``skip``'s), as :func:`_other_values` derives them from its type."""
    import annotated_types

    out = []
    for name, info in type(settings).model_fields.items():
        if name in skip:
            continue
        bounds = {}
        for m in info.metadata:
            if isinstance(m, annotated_types.Ge | annotated_types.Gt):
                bounds["ge" if isinstance(m, annotated_types.Ge) else "gt"] = next(
                    v for v in (getattr(m, "ge", None), getattr(m, "gt", None)) if v is not None
                )
        own = getattr(settings, name)
        out += [(name, v) for v in _other_values(info.annotation, own, bounds)]
    return out


def _model_variants(method: str) -> list[tuple[str, object]]:
    """(option, value) for every other value of every option of ``method`` that a config can
    set, from its annotations (:func:`_other_values`) and the registries' names (solvers,
    ILT algorithms)."""
    from nlmodels.model_registry import model_option_types, model_signature, registry_choices

    choices, own, out = registry_choices(method), _variant_base(method).model, []
    for name, default in model_signature(method).items():
        value = own.get(name, default)
        if name in choices:
            out += [(name, v) for v in choices[name] if v != value]
        else:
            types = model_option_types(method)
            out += [(name, v) for v in _other_values(types.get(name), value, {})]
    return out


def _variant_base(method: str):
    """The paper cell of ``method`` on the spiral DDE, on fewer trajectories."""
    (cell,) = [c for c in _paper_cells() if c.method == method and c.system == "spiral_dde"][:1]
    data = cell.data.model_copy(update={"n_trajectories": _VARIANT_TRAJECTORIES})
    return cell.model_copy(update={"data": data})


def _vary(cell, part: str, name: str, value):
    """``cell`` with setting ``name`` of its ``part`` (``training``, ``data``, ``model``) set
    to ``value``, validated as a config is; None where the config refuses it."""
    from pydantic import ValidationError

    from tasks.config import CellConfig

    raw = cell.model_dump()
    raw[part] = {**raw[part], name: value}
    try:
        return CellConfig.model_validate(raw)
    except ValidationError:
        return None


def _check_model(cell) -> None:
    """Every Python line of ``nltrain``/``nlmodels`` that ``cell``'s one-epoch training and
    forecast run, its model canary runs."""
    from tasks.machine.numerics import model_key

    packs = _packs([cell])
    _train_real(packs)  # untraced first: imports and once-per-process checks
    with _lines_run(("nltrain", "nlmodels")) as canary:
        _run_canary(model_key(cell))
    with _lines_run(("nltrain", "nlmodels")) as real:
        _train_real(packs)
    assert not _missing(real, canary), "\n".join(_missing(real, canary))


def _protocol_variants(method: str) -> list[tuple[str, object]]:
    # epochs: the real cell trains one; every other field of the protocol, the batch included
    return _field_variants(_variant_base(method).training, skip={"epochs"})


def _training_variants() -> list[tuple[str, str, object]]:
    return [(m, n, v) for m in ("neural_laplace", "node") for n, v in _protocol_variants(m)]


@pytest.mark.parametrize(
    "method,name,value", _training_variants(), ids=lambda x: str(x).replace(" ", "")
)
def test_a_models_canary_runs_every_line_of_a_cell_trained_otherwise(method, name, value):
    """A cell whose protocol differs from the paper's in one setting (each other value of
    each of :class:`~nltrain.TrainConfig`'s fields, derived from its type): its canary trains
    as it does, and runs every line it runs."""
    cell = _vary(_variant_base(method), "training", name, value)
    assert cell is not None, f"training.{name} = {value!r} was refused"
    _check_model(cell)


def _data_variants() -> list[tuple[str, str, object]]:
    # the source is the system itself; trajectories, the canary's own size, are the groups'
    fields = _field_variants(_variant_base("node").data, skip={"source", "n_trajectories"})
    systems = sorted({c.system for c in _paper_cells()})
    return [(s, n, v) for s in systems for n, v in fields]


@pytest.mark.parametrize(
    "system,name,value", _data_variants(), ids=lambda x: str(x).replace(" ", "")
)
def test_a_systems_canary_runs_every_line_of_data_made_otherwise(system, name, value):
    """A cell whose data differ from the paper's in one setting (each other value of each of
    the data configuration's fields, derived from its type): its system canary makes its data
    as it does, and runs every line it runs."""
    (base,) = [c for c in _paper_cells() if c.method == "node" and c.system == system]
    cell = _vary(_vary(base, "data", "n_trajectories", _VARIANT_TRAJECTORIES), "data", name, value)
    if cell is None:
        pytest.skip(f"data.{name} = {value!r} is refused for {system}")
    _check_data(cell)


def _all_model_variants() -> list[tuple[str, str, object]]:
    methods = sorted({c.method for c in _paper_cells()})
    return [("model", m, n, v) for m in methods for n, v in _model_variants(m)] + [
        ("training", m, n, v) for m in methods for n, v in _protocol_variants(m)
    ]


@pytest.mark.slow  # a few minutes: every model's every option and protocol setting
@pytest.mark.parametrize(
    "part,method,name,value", _all_model_variants(), ids=lambda x: str(x).replace(" ", "")
)
def test_every_models_canary_runs_every_line_of_its_cells_built_otherwise(
    part, method, name, value
):
    """Every model with each other value of each of its options (its annotations and the
    solvers' and ILTs' registries) and of each protocol setting: the canary of the cell runs
    every line the cell runs."""
    cell = _vary(_variant_base(method), part, name, value)
    if cell is None:
        pytest.skip(f"{part}.{name} = {value!r} is refused for {method}")
    _check_model(cell)


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
