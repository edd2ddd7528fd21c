"""Systems a user declares: trajectories from a data file, or a simulator of their own.

A data file holds N trajectories on one shared, strictly increasing time grid (the paper's
setting): CSV or Parquet in long form (one row per trajectory and time: a trajectory column, a
time column and one column per state variable) or NPZ with ``t [T]`` and ``x [N, T, D]``. A
simulator is a function ``(n_trajectories, seed, **options) -> (t [T], x [N, T, D])``, named as
``package.module:function`` or by an entry point of the group ``nllab.systems``.

Every problem with a file is one :class:`DataFileError` line naming the file and the problem,
raised before anything is written. A declared system joins ``datasets.SYSTEMS`` for this process;
its data fingerprint carries the file's content digest (or the simulator's source), so editing
the file gives new cache entries and the same bytes under another path reuse them.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np

from datasets._simulate import available_memory
from datasets._systems import (
    BUILTIN_SYSTEMS,
    RawTrajectories,
    SystemInfo,
    SystemSpec,
    register_system,
)

__all__ = [
    "FORMATS",
    "SYSTEM_ENTRY_POINTS",
    "DataFileError",
    "declare_file",
    "declare_simulator",
    "file_digest",
    "read_trajectories",
    "simulator_fingerprint",
]

#: Data file suffixes understood, and the entry point group of packaged simulators.
FORMATS = (".csv", ".parquet", ".npz")
SYSTEM_ENTRY_POINTS = "nllab.systems"
#: Bytes of memory per byte of file while a file is parsed into arrays and then trained on
#: (text and frame copies, then ``_simulate._ARRAY_COPIES`` arrays): checked before reading.
_MEMORY_PER_FILE_BYTE = 8
#: Trajectories and time points the seeded split and the observed/forecast split need at least.
MIN_TRAJECTORIES, MIN_POINTS = 3, 4
_NAME = re.compile(r"[a-z][a-z0-9_]*")


class DataFileError(ValueError):
    """A data file that cannot be used: the message names the file and the problem."""


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"system name {name!r} must be lower-case letters, digits and '_', starting with a "
            "letter"
        )
    if name in BUILTIN_SYSTEMS:
        raise ValueError(f"{name!r} is a built-in system; declare yours under another name")


def file_digest(path: str | Path) -> str:
    """sha256 of the file's bytes (what the cell hash and the cache key carry, not the path)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fail(path: Path, problem: str) -> DataFileError:
    return DataFileError(f"data file {str(path)!r}: {problem}")


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise _fail(path, "does not exist")
    if path.suffix.lower() not in FORMATS:
        raise _fail(path, f"unknown format {path.suffix!r}; valid: {', '.join(FORMATS)}")
    size = path.stat().st_size
    if size == 0:
        raise _fail(path, "is empty")
    available = available_memory()
    if available is not None and size * _MEMORY_PER_FILE_BYTE > available:
        gib = 2.0**30
        raise _fail(
            path,
            f"is {size / gib:.2f} GiB; reading and training on it needs about "
            f"{size * _MEMORY_PER_FILE_BYTE / gib:.1f} GiB of memory and "
            f"{available / gib:.1f} GiB is available",
        )


def _long_form(
    path: Path, trajectory: str, time: str, state: Sequence[str] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """(ids [N], t [N, T'], x [N, T', D]) from a long-form table; ``T'`` equal per trajectory."""
    import pandas as pd

    try:
        if path.suffix.lower() == ".csv":
            frame = pd.read_csv(path)
        else:
            frame = pd.read_parquet(path)
    except Exception as err:  # the readers raise many kinds; each is "cannot be read"
        kind = path.suffix.lower().lstrip(".").upper()
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise _fail(path, f"cannot be read as {kind} ({first})") from None
    columns = [str(c) for c in frame.columns]
    for needed in (trajectory, time, *(state or ())):
        if needed not in columns:
            raise _fail(path, f"missing column {needed!r} (columns: {', '.join(columns)})")
    if state is None:
        state = tuple(c for c in columns if c not in (trajectory, time))
        if not state:
            raise _fail(path, f"no state column besides {trajectory!r} and {time!r}")
    extra = [c for c in columns if c not in (trajectory, time, *state)]
    if extra:
        raise _fail(
            path, f"extra column {extra[0]!r} (not {trajectory!r}, {time!r} or a state column)"
        )
    if len(frame) == 0:
        raise _fail(path, "is empty (no rows)")
    values = {}
    for c in (time, *state):
        v = pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.isnan(v) & frame[c].notna().to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            raise _fail(
                path, f"column {c!r} is not numeric ({frame[c].iloc[row]!r} in row {row + 2})"
            )
        values[c] = v
    codes, ids = pd.factorize(frame[trajectory], sort=False)
    if (codes < 0).any():
        raise _fail(path, f"column {trajectory!r} has an empty value")
    counts = np.bincount(codes)
    order = np.argsort(codes, kind="stable")  # file order within each trajectory
    if (counts != counts[0]).any():
        k = int(np.argmax(counts != counts[0]))
        raise _fail(
            path,
            f"trajectory {ids[k]!r} has {counts[k]} time points and trajectory {ids[0]!r} "
            f"{counts[0]}: the time grid must be the same for every trajectory",
        )
    n, steps = len(ids), int(counts[0])
    t = values[time][order].reshape(n, steps)
    x = np.stack([values[c][order] for c in state], axis=-1).reshape(n, steps, len(state))
    return np.asarray(ids), t, x, tuple(state)


def _npz(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except Exception as err:
        raise _fail(path, f"cannot be read as NPZ ({type(err).__name__}: {err})") from None
    for key in ("t", "x"):
        if key not in arrays:
            raise _fail(path, f"missing array {key!r} (arrays: {', '.join(arrays) or 'none'})")
    extra = sorted(set(arrays) - {"t", "x"})
    if extra:
        raise _fail(path, f"extra array {extra[0]!r} (expected only 't' [T] and 'x' [N, T, D])")
    t, x = arrays["t"], arrays["x"]
    if t.ndim != 1 or x.ndim != 3 or x.shape[1] != t.shape[0]:
        raise _fail(path, f"expected t [T] and x [N, T, D], got t {t.shape} and x {x.shape}")
    if x.size == 0:
        raise _fail(path, "is empty (no values in x)")
    try:
        t, x = t.astype(np.float64), x.astype(np.float64)
    except (TypeError, ValueError):
        raise _fail(path, f"t and x must be numeric, got {t.dtype} and {x.dtype}") from None
    n = x.shape[0]
    return (
        np.arange(n),
        np.broadcast_to(t, (n, t.size)),
        x,
        tuple(f"x{i}" for i in range(x.shape[2])),
    )


def check_trajectories(
    where: str, ids: np.ndarray, t: np.ndarray, x: np.ndarray, n_observed: int | None = None
) -> np.ndarray:
    """The shared grid ``[T]`` of ``t [N, T]``; raises ``ValueError`` (prefixed by ``where``)
    on non-finite values, fewer than 3 trajectories or 4 times, times not strictly increasing,
    or a grid that differs between trajectories (naming the first that does)."""

    def fail(problem: str) -> ValueError:
        return DataFileError(f"{where}: {problem}")

    ids = np.asarray(ids).tolist()  # plain ints and strings in the messages

    bad = ~np.isfinite(t)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise fail(f"non-finite time ({t[i, j]}) in trajectory {ids[i]!r} at index {j}")
    bad = ~np.isfinite(x)
    if bad.any():
        i, j, d = np.argwhere(bad)[0]
        raise fail(
            f"non-finite value ({x[i, j, d]}) in trajectory {ids[i]!r} at t = {t[i, j]:g} "
            f"(state dimension {d})"
        )
    n, steps = t.shape
    if n < MIN_TRAJECTORIES:
        raise fail(
            f"holds {n} trajector{'y' if n == 1 else 'ies'}; the train/validation/test split "
            f"needs at least {MIN_TRAJECTORIES}"
        )
    need = max(MIN_POINTS, (n_observed or 0) + 1)
    if steps < need:
        raise fail(
            f"has {steps} time points per trajectory; the observed/forecast split needs at "
            f"least {need}" + (f" (n_observed = {n_observed})" if n_observed else "")
        )
    step = np.diff(t, axis=1)
    if (step <= 0).any():
        i, j = np.argwhere(step <= 0)[0]
        what = "duplicate time" if step[i, j] == 0 else "time not increasing:"
        raise fail(
            f"{what} t = {t[i, j + 1]:g} after t = {t[i, j]:g} in trajectory {ids[i]!r}; "
            "times must be strictly increasing"
        )
    scale = max(1.0, float(np.abs(t[0]).max()))
    differs = (np.abs(t - t[0]) > 1e-9 * scale).any(axis=1)
    if differs.any():
        i = int(np.argmax(differs))
        j = int(np.argmax(np.abs(t[i] - t[0]) > 1e-9 * scale))
        raise fail(
            f"trajectory {ids[i]!r} has a different time grid from trajectory {ids[0]!r} "
            f"(t = {t[i, j]:g} against {t[0, j]:g} at index {j}); one shared grid is needed"
        )
    return np.ascontiguousarray(t[0])


def read_trajectories(
    path: str | Path,
    *,
    trajectory: str = "trajectory",
    time: str = "t",
    state: Sequence[str] | None = None,
    n_observed: int | None = None,
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """``(t [T], x [N, T, D], state column names)`` of a data file, every check passed."""
    p = Path(path)
    _check_file(p)
    if p.suffix.lower() == ".npz":
        ids, t, x, labels = _npz(p)
    else:
        ids, t, x, labels = _long_form(p, trajectory, time, state)
    grid = check_trajectories(f"data file {str(p)!r}", ids, t, x, n_observed)
    return grid, np.ascontiguousarray(x), labels


def _subgrid(t: np.ndarray, n_points: int, name: str) -> np.ndarray:
    """Indices of ``n_points`` evenly spread times of ``t`` (all of them when equal)."""
    if n_points > t.size:
        raise ValueError(f"{name}: n_points = {n_points}, and the system has {t.size} times")
    return np.unique(np.round(np.linspace(0, t.size - 1, n_points)).astype(int))


def _rows(n: int, total: int, rng: np.random.Generator, name: str) -> np.ndarray:
    """All rows when ``n`` is the total, else a seeded subset in file order."""
    if n > total:
        raise ValueError(f"{name}: n_trajectories = {n}, and the system has {total}")
    return np.arange(total) if n == total else np.sort(rng.choice(total, n, replace=False))


def _from_arrays(
    info: SystemInfo,
    t: np.ndarray,
    make: Callable[[int, np.random.Generator], np.ndarray],
    fingerprint: str,
) -> SystemSpec:
    def grid(n_points: int) -> tuple[np.ndarray, np.ndarray]:
        sub = t[_subgrid(t, n_points, info.name)]
        return sub, sub.copy()

    def generate(n, t_model, tp, rng, workers) -> RawTrajectories:
        x = make(n, rng)
        x = x[:, np.searchsorted(t, t_model)]
        rows = np.arange(n, dtype=np.float64)[:, None]
        return RawTrajectories(signal=x, clean=x, ic=rows)

    return SystemSpec(info, grid, generate, fingerprint)


def declare_file(
    name: str,
    path: str | Path,
    *,
    trajectory: str = "trajectory",
    time: str = "t",
    state: Sequence[str] | None = None,
    n_observed: int | None = None,
    digest: str | None = None,
) -> SystemInfo:
    """Register system ``name`` from a data file (checked by :func:`read_trajectories`).

    ``digest``: the content digest the file must still have (a cell declared earlier), else a
    :class:`DataFileError` says it changed. The system's initial conditions (``ic``) are the rows
    of the file; ``n_trajectories`` below the file's takes a seeded subset, ``n_points`` below
    its grid evenly spread times."""
    check_name(name)
    p = Path(path)
    _check_file(p)
    found = file_digest(p)
    if digest is not None and found != digest:
        raise _fail(
            p, f"changed since its cells were configured (sha256 {found[:12]}…, was {digest[:12]}…)"
        )
    t, x, labels = read_trajectories(
        p, trajectory=trajectory, time=time, state=state, n_observed=n_observed
    )
    info = SystemInfo(
        name=name,
        state_dim=x.shape[2],
        default_points=t.size,
        default_trajectories=x.shape[0],
        properties=frozenset(),
        description=f"{x.shape[0]} trajectories of ({', '.join(labels)}) from {p.name}",
        ic_labels=("row",),
        grid=f"the file's {t.size} times, t = {t[0]:g} … {t[-1]:g}",
        initial_conditions="the file's trajectories (a seeded subset when fewer are asked for)",
        source=f"file {p} (sha256 {found[:12]})",
    )
    columns = json.dumps([trajectory, time, list(labels)])
    system = _from_arrays(
        info, t, lambda n, rng: x[_rows(n, x.shape[0], rng, name)], found + columns
    )
    register_system(system)
    return info


def _simulator(target: str) -> Callable[..., Any]:
    """The function behind ``package.module:function`` or an entry point name."""
    if ":" not in target:
        found = [ep for ep in entry_points(group=SYSTEM_ENTRY_POINTS) if ep.name == target]
        if not found:
            raise ValueError(
                f"simulator {target!r} is neither 'package.module:function' nor an entry point "
                f"of the group {SYSTEM_ENTRY_POINTS!r}"
            )
        target = found[0].value
    module, _, attr = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"simulator {target!r} cannot be imported ({type(err).__name__}: {err})"
        ) from None
    if not callable(fn):
        raise ValueError(f"simulator {target!r} is not a function")
    return fn


def simulator_fingerprint(target: str, options: Mapping[str, Any]) -> str:
    """sha256 of the simulator's module source (or its own, where the module's is not
    readable), its name and its options: a change to the code re-simulates and retrains."""
    fn = _simulator(target)
    try:
        code = inspect.getsource(inspect.getmodule(fn) or fn)
    except (OSError, TypeError):
        code = getattr(getattr(fn, "__code__", None), "co_code", b"").hex()
    payload = json.dumps({"target": target, "options": dict(options), "code": code}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def declare_simulator(
    name: str,
    target: str,
    options: Mapping[str, Any] | None = None,
    *,
    n_observed: int | None = None,
) -> SystemInfo:
    """Register system ``name`` simulated by the user's function ``target`` called as
    ``fn(n_trajectories, seed, **options) -> (t [T], x [N, T, D])``; its grid must not depend on
    ``n_trajectories`` or ``seed`` (checked on every call)."""
    check_name(name)
    options = dict(options or {})
    fn = _simulator(target)
    where = f"simulator {target!r}"

    def call(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        try:
            t, x = fn(n, seed, **options)
        except Exception as err:
            raise ValueError(f"{where} failed ({type(err).__name__}: {err})") from err
        except SystemExit as err:  # its data set fails, never the command (with exit code 0)
            raise ValueError(f"{where} called sys.exit({err.code!r})") from err
        t, x = np.asarray(t, dtype=np.float64), np.asarray(x, dtype=np.float64)
        if t.ndim != 1 or x.ndim != 3 or x.shape[:2] != (n, t.size):
            raise ValueError(
                f"{where} must return t [T] and x [{n}, T, D], got {t.shape} and {x.shape}"
            )
        check_trajectories(where, np.arange(n), np.broadcast_to(t, (n, t.size)), x, n_observed)
        return t, x

    t, x = call(MIN_TRAJECTORIES, 0)

    def make(n: int, rng: np.random.Generator) -> np.ndarray:
        t_n, x_n = call(n, int(rng.integers(2**32)))
        if not np.array_equal(t_n, t):
            raise ValueError(f"{where} returned another time grid for n_trajectories = {n}")
        return x_n

    info = SystemInfo(
        name=name,
        state_dim=x.shape[2],
        default_points=t.size,
        default_trajectories=1000,
        properties=frozenset(),
        description=f"simulated by {target}" + (f" with {json.dumps(options)}" if options else ""),
        ic_labels=("row",),
        grid=f"the simulator's {t.size} times, t = {t[0]:g} … {t[-1]:g}",
        initial_conditions="drawn by the simulator from the seed",
        source=f"simulator {target}",
    )
    register_system(_from_arrays(info, t, make, simulator_fingerprint(target, options)))
    return info
