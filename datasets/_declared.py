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
import math
import re
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np

from datasets._datafile import (
    FORMATS,
    DataFileError,
    check_file,
    fail,
    quote,
    read_long_form,
    read_npz,
)
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

#: The entry point group of packaged simulators.
SYSTEM_ENTRY_POINTS = "nllab.systems"
#: Trajectories and time points the seeded split and the observed/forecast split need at least.
MIN_TRAJECTORIES, MIN_POINTS = 3, 4
_NAME = re.compile(r"[a-z][a-z0-9_]*")


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


def _max_abs(count: int) -> float:
    """The largest magnitude whose ``count`` squares still sum to a finite float64 (the
    normaliser's variance), with a margin of 4 for the sum's rounding and the mean's shift."""
    return math.sqrt(np.finfo(np.float64).max / (4.0 * max(count, 1)))


def _overflowing(x: np.ndarray) -> tuple[int, int, int] | None:
    """Index ``(trajectory, time, dimension)`` of the largest value of the first state dimension
    too large to normalise (:func:`_max_abs`), else ``None``; one dimension at a time (a
    temporary of one dimension's size)."""
    for d in range(x.shape[-1]):
        column = x[..., d]
        top = np.unravel_index(int(np.argmax(np.abs(column))), column.shape)
        if abs(column[top]) > _max_abs(column.size):
            return int(top[0]), int(top[1]), d
    return None


def check_trajectories(
    where: str, ids: np.ndarray, t: np.ndarray, x: np.ndarray, n_observed: int | None = None
) -> np.ndarray:
    """The shared grid ``[T]`` of ``t [N, T]``; raises ``ValueError`` (prefixed by ``where``)
    on non-finite values, fewer than 3 trajectories or 4 times, times not strictly increasing,
    or a grid that differs between trajectories (naming the first that does)."""

    def fail(problem: str) -> ValueError:
        return DataFileError(f"{where}: {problem}")

    shown = [quote(repr(i), 40) for i in np.asarray(ids).tolist()]  # as messages show them

    bad = ~np.isfinite(t)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise fail(f"non-finite time ({t[i, j]}) in trajectory {shown[i]} at index {j}")
    bad = ~np.isfinite(x)
    if bad.any():
        i, j, d = np.argwhere(bad)[0]
        raise fail(
            f"non-finite value ({x[i, j, d]}) in trajectory {shown[i]} at t = {t[i, j]:g} "
            f"(state dimension {d})"
        )
    if (big := _overflowing(x)) is not None:
        i, j, d = big
        raise fail(
            f"value {x[i, j, d]:g} in trajectory {shown[i]} at t = {t[i, j]:g} (state dimension "
            f"{d}) is too large to normalise: its mean and spread overflow float64 (keep "
            f"|x| below {_max_abs(x[..., d].size):.3g}, or rescale the data)"
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
            f"{what} t = {t[i, j + 1]:g} after t = {t[i, j]:g} in trajectory {shown[i]}; "
            "times must be strictly increasing"
        )
    scale = max(1.0, float(np.abs(t[0]).max()))
    differs = (np.abs(t - t[0]) > 1e-9 * scale).any(axis=1)
    if differs.any():
        i = int(np.argmax(differs))
        j = int(np.argmax(np.abs(t[i] - t[0]) > 1e-9 * scale))
        raise fail(
            f"trajectory {shown[i]} has a different time grid from trajectory {shown[0]} "
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
    check_file(p)
    if p.suffix.lower() == ".npz":
        ids, t, x, labels = read_npz(p)
    else:
        ids, t, x, labels = read_long_form(p, trajectory, time, state)
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
    check_file(p)
    found = file_digest(p)
    if digest is not None and found != digest:
        raise fail(
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
        found = {
            (ep.value, getattr(ep.dist, "name", "?")): ep
            for ep in entry_points(group=SYSTEM_ENTRY_POINTS)
            if ep.name == target
        }
        if not found:
            raise ValueError(
                f"simulator {target!r} is neither 'package.module:function' nor an entry point "
                f"of the group {SYSTEM_ENTRY_POINTS!r}"
            )
        if len(found) > 1:  # which one a run used would depend on the install order
            named = " and ".join(f"{value} (package {dist})" for value, dist in sorted(found))
            raise ValueError(
                f"simulator name {target!r} is claimed by {named}: none is used by that name "
                '(declare one with simulator = "MODULE:FUNCTION")'
            )
        target = next(iter(found.values())).value
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
            raise ValueError(f"{where} failed ({type(err).__name__}: {quote(err)})") from err
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
