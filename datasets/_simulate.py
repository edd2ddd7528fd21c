"""``simulate``: one seeded, fingerprinted data set of a benchmark system."""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from dataclasses import dataclass

import numpy as np

from datasets._systems import SYSTEM_SPECS, SYSTEMS, SystemInfo

#: Bump whenever a change alters generated data: it is part of every fingerprint and cache key.
DATA_VERSION = "1"
#: Systems whose data changed since without a change of ``DATA_VERSION`` (which would re-key every
#: system): their fingerprints, and so their cache files, change; the others keep theirs.
#: 2: ``exp`` through the C library (:func:`datasets._closed.exp`), the same on every CPU (it
#: was numpy's, whose AVX-512F loop rounds differently); for stiff Van der Pol, RODAS4 in
#: element-wise arithmetic (:mod:`datasets._stiff`; it was LSODA, whose BLAS kernels the machine's
#: OpenBLAS picks by CPU).
SYSTEM_REVISIONS = {"mackey_glass_dde": 2, "integro_de": 2, "stiff_van_der_pol": 2}


@dataclass(frozen=True, eq=False)
class Dataset:
    """Simulated trajectories of one system; all arrays float64 numpy, read-only.

    Attributes:
        system: registry name (see ``SYSTEMS``).
        t: ``[T]`` model time grid (Mackey–Glass and Van der Pol: relabelled, see ``t_physical``).
        x: ``[N, T, D]`` observations (with Gaussian noise N(0, noise_std²) when noise_std > 0).
        x_clean: ``[N, T, D]`` noise-free values (noisy_sines: the uncorrupted sin t + sin 2t).
        ic: ``[N, k]`` per-trajectory initial condition / history constant / switch point / phase;
            columns named by ``SYSTEMS[system].ic_labels``; enough to re-solve any trajectory.
        t_physical: ``[T]`` the times in the system's own units at which ``x`` was sampled.
        seed: seed of the initial-condition draws and the noise.
        noise_std: σ of the additive observation noise.
        fingerprint: sha256 hex of everything that determines the data (the "dataset hash").
    """

    system: str
    t: np.ndarray
    x: np.ndarray
    x_clean: np.ndarray
    ic: np.ndarray
    t_physical: np.ndarray
    seed: int
    noise_std: float
    fingerprint: str

    @property
    def n_trajectories(self) -> int:
        return self.x.shape[0]

    @property
    def n_points(self) -> int:
        return self.x.shape[1]

    @property
    def state_dim(self) -> int:
        return self.x.shape[2]

    @property
    def info(self) -> SystemInfo:
        return SYSTEMS[self.system]


@dataclass(frozen=True)
class SimRequest:
    system: str
    n_trajectories: int
    n_points: int
    seed: int
    noise_std: float


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def make_request(system, n_trajectories, n_points, seed, noise_std) -> SimRequest:
    """Validate the arguments and fill the system defaults."""
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; valid systems: {', '.join(SYSTEMS)}")
    info = SYSTEMS[system]
    n = info.default_trajectories if n_trajectories is None else n_trajectories
    t = info.default_points if n_points is None else n_points
    try:
        sigma = float(noise_std)
    except (TypeError, ValueError):
        raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}") from None
    if not math.isfinite(sigma) or sigma < 0.0:
        raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}")
    return SimRequest(
        system=system,
        n_trajectories=check_int("n_trajectories", n, 1),
        n_points=check_int("n_points", t, 4),
        seed=check_int("seed", seed, 0),
        noise_std=sigma,
    )


#: Arrays of N × T × D float64 numbers alive at once while a data set is simulated, noised,
#: cached and split into training tensors (signal, clean signal, noise, noisy copy, splits).
_ARRAY_COPIES = 6


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux ``MemAvailable``), or ``None``."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(
    system: str, n_trajectories: int | None = None, n_points: int | None = None
) -> int:
    """Estimated bytes to simulate and train on this data set; raises ``ValueError`` with the
    estimate when it exceeds the memory available now (before anything is allocated)."""
    req = make_request(system, n_trajectories, n_points, 0, 0.0)
    dim = SYSTEMS[req.system].state_dim
    need = req.n_trajectories * req.n_points * dim * 8 * _ARRAY_COPIES
    available = available_memory()
    if available is not None and need > available:
        gib = 2.0**30
        raise ValueError(
            f"{req.system}: n_trajectories={req.n_trajectories} × {req.n_points} points × "
            f"{dim} dimension(s) needs about {need / gib:.1f} GiB of memory to simulate and "
            f"train, and {available / gib:.1f} GiB is available; use fewer trajectories or "
            f"points (the paper uses {SYSTEMS[req.system].default_trajectories} × "
            f"{SYSTEMS[req.system].default_points})"
        )
    return need


def check_workers(workers: int | None) -> int | None:
    return None if workers is None else check_int("workers", workers, 1)


def request_fingerprint(req: SimRequest) -> str:
    system = SYSTEM_SPECS[req.system]
    t, tp = system.grid(req.n_points)
    payload = {
        "data_version": DATA_VERSION,
        "system": req.system,
        "n_trajectories": req.n_trajectories,
        "n_points": req.n_points,
        "seed": req.seed,
        "noise_std": req.noise_std.hex(),  # exact, unlike a decimal repr
        "grid": hashlib.sha256(t.tobytes() + tp.tobytes()).hexdigest(),
    }
    if req.system in SYSTEM_REVISIONS:
        payload["revision"] = SYSTEM_REVISIONS[req.system]
    if system.fingerprint:  # a declared system: its file's digest or its simulator's source
        payload["source"] = system.fingerprint
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def read_only(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float64)
    a.flags.writeable = False
    return a


def simulate_request(req: SimRequest, workers: int | None) -> Dataset:
    check_memory(req.system, req.n_trajectories, req.n_points)
    system = SYSTEM_SPECS[req.system]
    t, tp = system.grid(req.n_points)
    # Independent streams: the initial-condition draws do not depend on noise_std, and the noise
    # pattern for a seed is the same at every σ (common random numbers across the noise study).
    ic_seq, noise_seq = np.random.SeedSequence(req.seed).spawn(2)
    raw = system.generate(req.n_trajectories, t, tp, np.random.default_rng(ic_seq), workers)
    if not (np.all(np.isfinite(raw.signal)) and np.all(np.isfinite(raw.clean))):
        raise RuntimeError(f"simulation of {req.system!r} produced non-finite values")
    x = raw.signal
    if req.noise_std > 0.0:
        x = x + req.noise_std * np.random.default_rng(noise_seq).standard_normal(x.shape)
    return Dataset(
        system=req.system,
        t=read_only(t),
        x=read_only(x),
        x_clean=read_only(raw.clean),
        ic=read_only(raw.ic),
        t_physical=read_only(tp),
        seed=req.seed,
        noise_std=req.noise_std,
        fingerprint=request_fingerprint(req),
    )


def simulate(
    system: str,
    n_trajectories: int | None = None,
    n_points: int | None = None,
    seed: int = 0,
    noise_std: float = 0.0,
    *,
    workers: int | None = None,
) -> Dataset:
    """Simulate ``n_trajectories`` trajectories of a benchmark system on ``n_points`` times.

    Systems, grids and initial conditions: ``SYSTEMS[name]`` (``datasets/_systems.py``).  Delay
    systems use the batched RK4 method of steps (``_dde``), stiff Van der Pol LSODA over
    ``workers`` processes (default: all available cores; the result does not depend on it), the
    rest closed forms.  Deterministic for a seed.

    Raises:
        ValueError: unknown system, ``n_trajectories < 1``, ``n_points < 4``, bad seed, or a
            negative / non-finite ``noise_std``.
    """
    req = make_request(system, n_trajectories, n_points, seed, noise_std)
    return simulate_request(req, check_workers(workers))
