"""Numerics fingerprints: the numbers a cell would produce today, per model and per system.

A stored cell is worth reusing only if the code that trained it computes the same numbers as
today's. A fingerprint answers that without training the cell: it hashes the *bytes* a tiny,
fixed canary produces through the code paths a cell takes, so it changes when a model's, the
trainer's or a system's arithmetic changes, and not when code is only moved, renamed or
commented (unlike a hash of the source, as Prefect's task cache or DVC key on).

A canary is the cell in miniature, so that it runs the cell's code paths:

* **model**: a few training steps of the model as the cell builds it (its settings: the
  model's keyword arguments that differ from its defaults, e.g. the paper profile's linear
  time functions of the Neural Flows or the ablation's ``stereographic = false``; initial
  weights drawn as :func:`tasks.pipeline.build_cell_model` draws them) at the cell's state
  dimension, trained by the cell's protocol in miniature (:func:`canary_training`: every
  setting of :class:`~nltrain.TrainConfig` is the cell's, its dtype, step size and clipping,
  but how long it trains), on fixed synthetic data, CPU, one torch thread, through
  :func:`nltrain.train_packed` one by one (the eager step of :func:`nltrain.train`: Neural
  Laplace's native kernels, or their torch twins, whichever this process runs — named in the
  hash, with the CPU numerics mode in effect, :mod:`nlmodels.numerics`) and as a pack of two
  seeds (the vmapped step, plain formulas): the losses, the weights after them and a forecast.
  Its sizes reach every branch of the native kernels that a cell's do (their full 32-column
  blocks and their tails at either vector width, the row blocks each state dimension takes),
  and a batch ends short, as a cell's last one does.
* **system**: a small simulation (:func:`datasets.simulate`, 10 trajectories) and its split
  (:func:`datasets.prepare`), each with the cell's keywords but how many trajectories
  (:func:`canary_split`: its normalisation, fractions, noise, grid; a sub-sample of the
  training trajectories where the cell takes one): every array's bytes.

Both take a cell's settings whole, by the fields of its configuration and the keywords of the
functions they feed, not from a list of the ones that matter; the few that only say how much
(epochs, batch size, trajectories) are the exceptions, named once here.

``tests/test_fingerprint_coverage.py`` measures that claim rather than trusting it: every line
of ``nltrain``, ``nlmodels`` and ``datasets`` that a paper-profile cell runs, and every line of
the native kernels (under gcov), the canary runs too.

Both include the torch and numpy versions. Computing one takes a fraction of a second to a
few seconds, so each is computed once per *source state*, keyed by a hash of every file that
can move a number (:mod:`nltrain.numerics._sources`: the packages ``nltrain``, ``nlmodels`` and
``datasets`` whole, and a plugin model's whole package), and by the CPU, its C library and
every environment variable that can move bytes (:func:`nlmodels.numerics_environment`: a cache
shared by two CPUs, or two targets of the native kernels, holds a fingerprint for each): a
start with unchanged sources reads a small file; an edit recomputes the canary, whose bytes
then decide. Since nothing in that key is the home's, the file is kept beside the installation
(:func:`datasets.installation_cache`, ``<sys.prefix>/var/cache/nllab/numerics``), where every
home of the installation finds it, and in the home (``data_home()/numerics``) only where the
installation's folder cannot be used or written; a fingerprint is read from the first of the
two that holds a record of its whole key.

A system split as by default (train-set normalisation, every training trajectory) hashes what
it hashed before splits were covered. Not covered: CUDA arithmetic (the canary runs on the
CPU), and orchestration (``tasks``, ``flows``: evaluation plots, tracking, the command line),
which cannot move a number.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nlmodels import numerics_environment, require_numerics
from nltrain._files import write_atomically
from nltrain._threads import torch_threads
from nltrain.numerics._miniature import (
    CANARY_NOISE,
    CANARY_PROTOCOL,
    canary_split,
    canary_training,
    canary_trajectories,
    data_keywords,
    settings_text,
)
from nltrain.numerics._sources import covered_sources

__all__ = [
    "FINGERPRINT_FORMAT",
    "keep_record",
    "model_fingerprint",
    "model_settings",
    "read_record",
    "source_key",
    "system_fingerprint",
    "training_digest",
]

#: Hashed first by the models' and the systems' canaries: bumped when what every one of them
#: hashes changes (a canary that still runs as before keeps its bytes under the same number).
_FORMAT = 2
_SYSTEM_FORMAT = 1
#: Which canaries made a fingerprint, as runs are tagged with it and the cache is keyed by it:
#: a stored run whose fingerprint and format both differ was fingerprinted by other canaries,
#: whatever its code. 2.1: at the cell's state dimension, batch sizes and split; 3: with the
#: cell's protocol and data keywords whole.
FINGERPRINT_FORMAT = "3"

_MEMO: dict[tuple[str, str, str], str] = {}
_MEMO_LOCK = threading.Lock()
_TOLD: set[str] = set()
#: The system canaries' data sets simulated in this process (the newest few), by source state,
#: system, size and simulation keywords: canaries that differ only in how one data set is split
#: (the observation-size study's cells) simulate it once. Data sets are frozen and read-only.
_SIMULATED: dict[tuple[str, str, int, str], Any] = {}
_SIMULATED_KEPT = 4
#: :func:`source_key`'s last key per method, with what it hashed besides the files and the
#: stamps of the files it read (where each lies, its inode, size, modified and changed times):
#: files whose stamps are unchanged are not read again. Kept only when every file was last
#: changed over :data:`_SETTLED_NS` before (git's "racily clean" rule): an edit after that
#: always gives a newer changed time, whatever the file system's timestamp resolution.
_Stamp = tuple[str, int, int, int, int, int]
_KEYS: dict[str | None, tuple[str, tuple[tuple[str, _Stamp], ...], str]] = {}
_SETTLED_NS = 1_000_000_000


def _versions() -> str:
    return f"torch {torch.__version__}; numpy {np.__version__}"


def source_key(method: str | None = None) -> str:
    """A hash of every file that can move a cell's numbers (:func:`covered_sources`: the
    numeric floors' packages whole, and ``method``'s plugin package), the versions, the native
    kernels' mode and the CPU numerics mode in effect: the cache key of every fingerprint
    (walked each call, a file read again when its stamp changed: a millisecond or two)."""
    h = hashlib.sha256(f"{FINGERPRINT_FORMAT}; {_versions()}".encode())
    h.update(os.environ.get("NLLAB_NATIVE", "auto").encode())
    h.update(_cpu_mark().encode())
    # the CPU and the environment too: a home shared by two CPUs, or another target of the
    # native kernels, computes its own canaries (their bytes then decide)
    h.update(numerics_environment().encode())
    files = sorted(covered_sources(method).items())
    head, stamps = h.hexdigest(), tuple((name, _stamp(path)) for name, path in files)
    with _MEMO_LOCK:
        known = _KEYS.get(method)
    if known is not None and known[:2] == (head, stamps):
        return known[2]
    for name, path in files:
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    key = h.hexdigest()
    settled = time.time_ns() - _SETTLED_NS
    if all(stamp[-1] < settled for _, stamp in stamps):
        with _MEMO_LOCK:
            _KEYS[method] = (head, stamps, key)
    return key


def _stamp(path: Path) -> _Stamp:
    """Where ``path`` lies and its device, inode, size, modified and changed times (last)."""
    info = path.stat()
    return str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


# -- the canaries -------------------------------------------------------------------------------
def _digest(h: hashlib._Hash, *arrays) -> None:
    for a in arrays:
        a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())


#: The canary's trajectories (train, validation) and batch: 45 = 37 + 8 and 40 = 32 + 8 columns
#: take the native kernels' 32-column blocks and their 5- and 8-column tails (one masked vector
#: of 8 doubles, or one full and one masked of 4); the training's second batch is short.
_CANARY_TRAIN, _CANARY_VAL, _CANARY_BATCH = 45, 40, 37


def _canary_splits(state_dim: int):
    """Fixed synthetic data (no random draws): damped oscillations of as many phases and
    frequencies as trajectories, in ``state_dim`` dimensions, 10 observed and 10 predicted
    points."""
    from datasets import SplitData

    t = np.linspace(0.0, 2.0, 20)
    k = np.arange(_CANARY_TRAIN + _CANARY_VAL, dtype=np.float64)[:, None, None]
    d = np.arange(state_dim, dtype=np.float64)[None, None, :]
    x = np.exp(-0.3 * t)[None, :, None] * np.sin((1.0 + 0.25 * k) * t[None, :, None] + k + d)
    train = SplitData.from_trajectories(t, x[:_CANARY_TRAIN], 10)
    return train, SplitData.from_trajectories(t, x[_CANARY_TRAIN:], 10)


def _train_canary(
    method: str,
    h: hashlib._Hash,
    settings: Mapping[str, Any],
    state_dim: int,
    protocol: Mapping[str, Any] | None = None,
) -> None:
    """Feed ``h`` the canary training's bytes: losses, weights after them and a forecast, of
    ``method`` built with ``settings`` for ``state_dim`` dimensions, trained by the canary's
    protocol changed by ``protocol`` (:func:`canary_training`)."""
    from nlmodels import build_model
    from nltrain._config import TrainConfig
    from nltrain._loop import LoopOptions
    from nltrain._packing import train_packed
    from nltrain._training import predict, seeded

    config = TrainConfig(**{**CANARY_PROTOCOL, "batch_size": _CANARY_BATCH, **(protocol or {})})
    train_split, val_split = _canary_splits(state_dim)
    for pack in (False, True):
        seeds = [0, 1] if pack else [0]
        models = []
        for s in seeds:
            with seeded(s):  # as tasks.pipeline.build_cell_model draws a cell's weights
                models.append(build_model(method, state_dim, **settings))
        # torch's global stream during training (a model's own draws), fixed too
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            results = train_packed(
                models,
                [train_split] * len(seeds),
                [val_split] * len(seeds),
                config,
                device="cpu",
                seeds=seeds,
                options=LoopOptions(labels=tuple(f"canary-{method}-{s}" for s in seeds)),
                pack=pack,
            )
            for model, res in zip(models, results, strict=True):
                h.update(f"pack={pack}; {type(res).__name__}".encode())
                if isinstance(res, Exception):
                    h.update(str(res).encode())
                    continue
                losses = [v for r in res.history for v in (r.train_loss, r.val_loss, r.val_rmse)]
                h.update(struct.pack(f"<{len(losses)}d", *losses))
                state = model.state_dict()
                _digest(h, *(state[k] for k in sorted(state)))
                _digest(h, predict(model, val_split))


def _cpu_mark() -> str:
    """The CPU numerics mode as fingerprints hash it: empty in the native mode, so that runs
    from before the portable mode (all native) keep their fingerprints."""
    mode = require_numerics().label
    return f"; cpu={mode}" if mode.startswith("portable") else ""


def _model_canary(
    method: str, settings: Mapping[str, Any], state_dim: int, protocol: Mapping[str, Any]
) -> str:
    from nlmodels import native_cpu_kernels

    h = hashlib.sha256(f"{_FORMAT}; {_versions()}; {method}; {state_dim}-D".encode())
    if settings:
        h.update(f"; settings {settings_text(settings)}".encode())
    # which fast path the eager step runs: native kernels and their torch twins are not
    # bitwise equal, so each has its own fingerprint; so has the portable CPU mode
    h.update(f"native={native_cpu_kernels()}{_cpu_mark()}".encode())
    # the protocol is not named: its bytes tell (a stop the canary never reaches moves none)
    _train_canary(method, h, settings, state_dim, protocol)
    return h.hexdigest()[:16]


def model_settings(method: str, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings of ``method`` that a fingerprint covers: its ``overrides`` (a cell's
    ``model`` keywords) whose value differs from the model's own default (a default spelt out
    is the same model, :func:`nlmodels.non_default_overrides`)."""
    from nlmodels import non_default_overrides

    return non_default_overrides(method, overrides or {})


def training_digest(
    method: str,
    overrides: Mapping[str, Any] | None = None,
    state_dim: int = 2,
    training: Mapping[str, Any] | None = None,
) -> str:
    """The canary training's bytes alone (no versions, modes or format), one torch thread, of
    ``method`` built with ``overrides`` (:func:`model_settings`) for ``state_dim`` dimensions,
    trained as by ``training`` (:func:`canary_training`): what the tests pin, so a CPU that
    computes other bytes fails naming the model."""
    h = hashlib.sha256()
    settings, protocol = model_settings(method, overrides), canary_training(training)
    with torch_threads(1):  # reductions split over threads round differently
        _train_canary(method, h, settings, state_dim, protocol)
    return h.hexdigest()[:16]


def _system_canary(system: str, split: Mapping[str, Any], key: str | None = None) -> str:
    from datasets import prepare

    simulated, _ = data_keywords()
    made = {"noise_std": CANARY_NOISE, **{k: v for k, v in split.items() if k in simulated}}
    ds = _canary_data(system, canary_trajectories(split.get("fractions")), made, key)
    p = prepare(ds, seed=0, **{k: v for k, v in split.items() if k not in simulated})
    h = hashlib.sha256(f"{_SYSTEM_FORMAT}; {_versions()}; {system}".encode())
    if split:
        h.update(f"; split {settings_text(split)}".encode())
    _digest(h, ds.t, ds.x, ds.x_clean, ds.ic, ds.t_physical)
    for s in (p.train, p.val, p.test):
        _digest(h, s.obs_t, s.obs_x, s.query_t, s.target, s.target_clean, s.index, s.ic)
    _digest(h, p.normaliser.mean, p.normaliser.std)
    return h.hexdigest()[:16]


def _canary_data(system: str, n: int, made: Mapping[str, Any], key: str | None):
    """:func:`datasets.simulate` of the system canary: ``n`` trajectories of ``system`` made with
    ``made``, at source state ``key``, simulated once per process (:data:`_SIMULATED`); with
    no ``key``, simulated afresh and not kept."""
    from datasets import simulate

    memo = None if key is None else (key, system, n, settings_text(made))
    with _MEMO_LOCK:
        ds = _SIMULATED.get(memo) if memo else None
    if ds is None:
        ds = simulate(system, n_trajectories=n, seed=0, workers=1, **made)
        if memo:
            with _MEMO_LOCK:
                _SIMULATED[memo] = ds
                while len(_SIMULATED) > _SIMULATED_KEPT:
                    _SIMULATED.pop(next(iter(_SIMULATED)))
    return ds


# -- the cache ----------------------------------------------------------------------------------
def _cache_dirs() -> list[Path]:
    """Where fingerprints (and this machine's pinned check) are kept, in the order they are
    read and written: the installation's cache (:func:`datasets.installation_cache`, which
    every home of the installation shares), where it can be used, then the home's."""
    from datasets import cache_folders

    return cache_folders("numerics")


def read_record(name: str) -> dict[str, Any] | None:
    """The record kept as ``name`` (a JSON object) in the first of the cache folders that
    holds one, else None."""
    for folder in _cache_dirs():
        try:
            record = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            return record
    return None


def keep_record(name: str, record: Mapping[str, object]) -> None:
    """Keep ``record`` as ``name`` in the first cache folder that takes it (the installation's,
    else the home's), atomically: two processes racing write the same bytes. Where none does,
    the next start only computes it again."""
    error: OSError | None = None
    for folder in _cache_dirs():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_atomically(folder / name, lambda f: f.write(json.dumps(record).encode()))
            return
        except OSError as e:
            error = e
    print(f"nllab: numerics fingerprint not cached ({error})", file=sys.stderr)


def _fingerprint(
    kind: str, name: str, key: str, canary: Callable[[], str], what: str | None = None
) -> str:
    """The fingerprint of ``kind`` ``name`` (``what`` it is, in messages; default ``name``) at
    source state ``key``: memoised, else read from the cache (a record of that whole key), else
    ``canary()`` run (one torch thread) and cached."""
    memo = (kind, name, key)
    with _MEMO_LOCK:
        if memo in _MEMO:
            return _MEMO[memo]
    file = f"{kind}-{name}-{key[:24]}.json"
    record = read_record(file) or {}
    fp = record.get("fingerprint") if record.get("key") == key else None
    if not isinstance(fp, str):
        t0 = time.perf_counter()
        try:
            with torch_threads(1):
                fp = canary()
        except (Exception, SystemExit) as e:  # user code's sys.exit too (a real stop is not)
            # The model or simulator fails as it runs: its cells fail on their own, with their
            # error; this fingerprint matches no stored run and is neither cached nor memoised.
            _tell_once(
                f"canary:{kind}:{name}",
                f"the numerics canary of {kind} {what or name} failed ({type(e).__name__}: "
                f"{e}); its cells are not reused by numerics",
            )
            return "failed-" + hashlib.sha256(f"{type(e).__name__}: {e}".encode()).hexdigest()[:9]
        keep_record(file, {"fingerprint": fp, "seconds": time.perf_counter() - t0, "key": key})
    with _MEMO_LOCK:
        _MEMO[memo] = fp
    return fp


def _tell_once(key: str, message: str) -> None:
    """``message`` on stderr, once per ``key`` in this process (worker processes share the
    terminal)."""
    with _MEMO_LOCK:
        if key in _TOLD:
            return
        _TOLD.add(key)
    print(f"nllab: {message}", file=sys.stderr, flush=True)


def _name(base: str, settings: Mapping[str, Any], mark: str = "+") -> str:
    """A cache file's name part for ``base`` with ``settings`` (after ``mark``)."""
    if not settings:
        return base
    return base + mark + hashlib.sha256(settings_text(settings).encode()).hexdigest()[:12]


def model_fingerprint(
    method: str,
    overrides: Mapping[str, Any] | None = None,
    state_dim: int = 2,
    training: Mapping[str, Any] | None = None,
) -> str:
    """The numerics fingerprint of model ``method`` built with ``overrides`` (a cell's
    ``model`` keywords; those at the model's default count as absent, :func:`model_settings`)
    for data of ``state_dim`` dimensions (the cell's system's:
    :func:`tasks.machine.numerics.model_key`)
    and trained as by ``training`` (the cell's :class:`~nltrain.TrainConfig`, or its fields:
    :func:`canary_training`) (16 hex digits; cached per source state, settings, dimension and
    protocol)."""
    if isinstance(state_dim, bool) or not isinstance(state_dim, int) or state_dim < 1:
        raise ValueError(f"state_dim must be a positive integer, got {state_dim!r}")
    settings, protocol = model_settings(method, overrides), canary_training(training)
    what = "; ".join([f"{state_dim}-D", *(settings_text(d) for d in (settings, protocol) if d)])
    return _fingerprint(
        "model",
        _name(_name(f"{method}-{state_dim}d", settings), protocol, "+t"),
        source_key(method),
        lambda: _model_canary(method, settings, state_dim, protocol),
        f"{method} ({what})",
    )


def system_fingerprint(system: str, data: Mapping[str, Any] | None = None) -> str:
    """The numerics fingerprint of data set ``system`` made as a cell makes it with ``data``
    (the keywords the cell passes :func:`datasets.simulate` and :func:`datasets.prepare`, e.g.
    ``{"normalise_on": "all"}``; those at their default count as absent:
    :func:`canary_split`) (16 hex digits; cached per source state and split)."""
    split, key = canary_split(data), source_key()
    return _fingerprint(
        "system", _name(system, split), key, lambda: _system_canary(system, split, key)
    )
