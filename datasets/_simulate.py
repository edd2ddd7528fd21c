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

#: Where the observation noise is added: ``"raw"``, to the simulated values in the system's
#: physical units (the z-score's statistics then include it); ``"normalised"``, by
#: :func:`datasets.prepare` after the z-score (statistics of the noise-free data), σ in
#: normalised units, as the paper's reference code does (``generate_data_set`` in its
#: ``experiments/datasets.py``: ``trajectories += randn · noise_std`` after normalising).
NOISE_ON: tuple[str, ...] = ("raw", "normalised")


@dataclass(frozen=True, eq=False)
class Dataset:
    """Simulated trajectories of one system; all arrays float64 numpy, read-only.

    Attributes:
        system: registry name (see ``SYSTEMS``).
        t: ``[T]`` model time grid (Mackey–Glass and Van der Pol: relabelled, see ``t_physical``).
        x: ``[N, T, D]`` observations: with Gaussian noise N(0, noise_std²) when noise_std > 0
            and ``noise_on == "raw"``; noise-free with ``"normalised"`` (:func:`datasets.prepare`
            adds the noise after the z-score).
        x_clean: ``[N, T, D]`` noise-free values (noisy_sines: the uncorrupted sin t + sin 2t).
        ic: ``[N, k]`` per-trajectory initial condition / history constant / switch point / phase;
            columns named by ``SYSTEMS[system].ic_labels``; enough to re-solve any trajectory.
        t_physical: ``[T]`` the times in the system's own units at which ``x`` was sampled.
        seed: seed of the initial-condition draws and the noise.
        noise_std: σ of the additive observation noise.
        fingerprint: sha256 hex of everything that determines the data (the "dataset hash").
        noise_on: where the noise is added (see ``NOISE_ON``); ``"raw"`` when noise_std is 0.
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
    noise_on: str = "raw"

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
    noise_on: str = "raw"


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def make_request(
    system, n_trajectories, n_points, seed, noise_std, noise_on: str = "raw"
) -> SimRequest:
    """Validate the arguments and fill the system defaults (no noise is noise ``"raw"``: where
    nothing is added is no part of the data)."""
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
    if noise_on not in NOISE_ON:
        raise ValueError(
            f"noise_on must be one of {', '.join(map(repr, NOISE_ON))}, got {noise_on!r}"
        )
    return SimRequest(
        system=system,
        n_trajectories=check_int("n_trajectories", n, 1),
        n_points=check_int("n_points", t, 4),
        seed=check_int("seed", seed, 0),
        noise_std=sigma,
        noise_on=noise_on if sigma > 0.0 else "raw",
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
    if req.noise_on != "raw":  # raw-noise data sets keep their fingerprints and cache files
        payload["noise_on"] = req.noise_on
    if req.system in SYSTEM_REVISIONS:
        payload["revision"] = SYSTEM_REVISIONS[req.system]
    if system.fingerprint:  # a declared system: its file's digest or its simulator's source
        payload["source"] = system.fingerprint
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def read_only(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float64)
    a.flags.writeable = False
    return a


def _streams(seed: int) -> list[np.random.SeedSequence]:
    """A data set's two independent streams: its initial-condition draws and its noise (so the
    initial conditions do not depend on noise_std, and the noise pattern for a seed is the same
    at every σ and wherever it is added: common random numbers across the noise study)."""
    return np.random.SeedSequence(seed).spawn(2)


def noise_draws(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The standard normal draws of the observation noise of data set ``seed`` (``[N, T, D]``,
    one per value, drawn over the whole data set before any split): σ times them is the noise,
    added by :func:`simulate` (``noise_on == "raw"``) or :func:`datasets.prepare`
    (``"normalised"``)."""
    return np.random.default_rng(_streams(seed)[1]).standard_normal(shape)


def simulate_request(req: SimRequest, workers: int | None) -> Dataset:
    check_memory(req.system, req.n_trajectories, req.n_points)
    system = SYSTEM_SPECS[req.system]
    t, tp = system.grid(req.n_points)
    raw = system.generate(
        req.n_trajectories, t, tp, np.random.default_rng(_streams(req.seed)[0]), workers
    )
    if not (np.all(np.isfinite(raw.signal)) and np.all(np.isfinite(raw.clean))):
        raise RuntimeError(f"simulation of {req.system!r} produced non-finite values")
    x = raw.signal
    if req.noise_std > 0.0 and req.noise_on == "raw":
        x = x + req.noise_std * noise_draws(req.seed, x.shape)
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
        noise_on=req.noise_on,
    )


def simulate(
    system: str,
    n_trajectories: int | None = None,
    n_points: int | None = None,
    seed: int = 0,
    noise_std: float = 0.0,
    noise_on: str = "raw",
    *,
    workers: int | None = None,
) -> Dataset:
    """Simulate ``n_trajectories`` trajectories of a benchmark system on ``n_points`` times.

    Systems, grids and initial conditions: ``SYSTEMS[name]`` (``datasets/_systems.py``).  Delay
    systems use the batched RK4 method of steps (``_dde``), stiff Van der Pol LSODA over
    ``workers`` processes (default: all available cores; the result does not depend on it), the
    rest closed forms.  Deterministic for a seed.  Observation noise N(0, noise_std²) is added to
    the values here (``noise_on="raw"``, physical units) or, with ``noise_on="normalised"``, by
    :func:`datasets.prepare` after the z-score, in normalised units (``NOISE_ON``).

    Raises:
        ValueError: unknown system, ``n_trajectories < 1``, ``n_points < 4``, bad seed, a
            negative / non-finite ``noise_std`` or an unknown ``noise_on``.
    """
    req = make_request(system, n_trajectories, n_points, seed, noise_std, noise_on)
    return simulate_request(req, check_workers(workers))
