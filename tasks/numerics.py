"""Numerics fingerprints: the numbers a cell would produce today, per model and per system.

A stored cell is worth reusing only if the code that trained it computes the same numbers as
today's. A fingerprint answers that without training the cell: it hashes the *bytes* a tiny,
fixed canary produces through the code paths a cell takes, so it changes when a model's, the
trainer's or a system's arithmetic changes, and not when code is only moved, renamed or
commented (unlike a hash of the source, as Prefect's task cache or DVC key on).

* **model**: a few training steps of the model (initial weights drawn as
  :func:`tasks.pipeline.build_cell_model` draws them) on fixed synthetic data, float64, CPU, one
  torch thread, through :func:`tasks.packing.train_packed` one by one (the eager step of
  :func:`tasks.training.train`: Neural Laplace's native kernels, or their torch twins, whichever
  this process runs — named in the hash, with the CPU numerics mode in effect,
  :mod:`nlmodels._numerics`) and as a pack of two seeds (the vmapped step, plain
  formulas): the losses, the weights after them and a forecast.
* **system**: a small simulation (:func:`datasets.simulate`, 4 trajectories) and its split
  (:func:`datasets.prepare`): every array's bytes.

Both include the torch and numpy versions. Computing one takes a fraction of a second to a
few seconds, so each is computed once per *source state* and cached under
``data_home()/numerics``, keyed by a hash of the source files it runs (``nlmodels/``,
``datasets/``, the training modules of ``tasks/`` and a plugin model's own file): a start with
unchanged sources reads a small file; an edit recomputes the canary, whose bytes then decide.

Not covered: CUDA arithmetic (the canary runs on the CPU), model settings other than the
defaults and data sizes other than the canary's (the same code at other sizes), and code
outside those folders that a cell runs (evaluation plots, tracking).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nlmodels._numerics import cpu_mode_in_effect
from tasks._notify import notify_once
from tasks.stopping import contained

__all__ = [
    "CellNumerics",
    "cell_tags",
    "model_fingerprint",
    "source_key",
    "stale",
    "system_fingerprint",
    "training_digest",
    "warm",
]

_ROOT = Path(__file__).resolve().parent.parent
#: Source a cell's numbers depend on (besides a plugin model's own file).
_SOURCES = (
    "nlmodels",
    "datasets",
    "tasks/training.py",
    "tasks/_steps.py",
    "tasks/_packer.py",
    "tasks/_packed_cells.py",
    "tasks/_packed_gru.py",
    "tasks/packing.py",
    "tasks/evaluation.py",
    "tasks/numerics.py",
)
_SUFFIXES = (".py", ".c", ".h")
#: Bumped when what a fingerprint hashes changes (old cache files are then ignored).
_FORMAT = 1

_MEMO: dict[tuple[str, str, str], str] = {}
_MEMO_LOCK = threading.Lock()


def _versions() -> str:
    return f"torch {torch.__version__}; numpy {np.__version__}"


def _hash_files(paths: Iterable[Path], h: hashlib._Hash) -> None:
    for p in sorted(paths):
        h.update(str(p.relative_to(_ROOT) if p.is_relative_to(_ROOT) else p.name).encode())
        h.update(p.read_bytes())


def source_key() -> str:
    """A hash of the source files a cell's numbers depend on, the versions, the native
    kernels' mode and the CPU numerics mode in effect (the cache key of every fingerprint;
    re-read each call: a few milliseconds)."""
    h = hashlib.sha256(f"{_FORMAT}; {_versions()}".encode())
    h.update(os.environ.get("NLLAB_NATIVE", "auto").encode())
    h.update(_cpu_mark().encode())
    files: list[Path] = []
    for name in _SOURCES:
        p = _ROOT / name
        if p.is_dir():
            files += [f for f in p.rglob("*") if f.suffix in _SUFFIXES and f.is_file()]
        elif p.is_file():
            files.append(p)
    _hash_files(files, h)
    return h.hexdigest()


def _model_source(method: str) -> str:
    """The source key of ``method``: :func:`source_key`, and the model's own file when it lives
    outside ``nlmodels/`` (a plugin)."""
    from nlmodels import MODELS

    key = source_key()
    try:
        path = Path(inspect.getsourcefile(MODELS[method]) or "")
    except (TypeError, OSError):
        return key
    if path.is_file() and not path.resolve().is_relative_to(_ROOT / "nlmodels"):
        h = hashlib.sha256(key.encode())
        _hash_files([path.resolve()], h)
        key = h.hexdigest()
    return key


# -- the canaries -------------------------------------------------------------------------------
def _digest(h: hashlib._Hash, *arrays) -> None:
    for a in arrays:
        a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())


def _canary_splits(state_dim: int = 2):
    """Fixed synthetic data (no random draws): damped oscillations of 12 phases and
    frequencies, 10 observed and 10 predicted points; 8 train and 4 validation trajectories."""
    from datasets import SplitData

    t = np.linspace(0.0, 2.0, 20)
    k = np.arange(12, dtype=np.float64)[:, None, None]
    d = np.arange(state_dim, dtype=np.float64)[None, None, :]
    x = np.exp(-0.3 * t)[None, :, None] * np.sin((1.0 + 0.25 * k) * t[None, :, None] + k + d)
    return SplitData.from_trajectories(t, x[:8], 10), SplitData.from_trajectories(t, x[8:], 10)


def _train_canary(method: str, h: hashlib._Hash) -> None:
    """Feed ``h`` the canary training's bytes: losses, weights after them and a forecast."""
    from nlmodels import build_model
    from tasks.config import TrainConfig
    from tasks.packing import train_packed
    from tasks.training import predict, seeded

    config = TrainConfig(epochs=2, patience=None, batch_size=4, lr=1e-2, grad_clip=1.0)
    train_split, val_split = _canary_splits()
    for pack in (False, True):
        seeds = [0, 1] if pack else [0]
        models = []
        for s in seeds:
            with seeded(s):  # as tasks.pipeline.build_cell_model draws a cell's weights
                models.append(build_model(method, 2))
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
                labels=[f"canary-{method}-{s}" for s in seeds],
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
    mode = cpu_mode_in_effect()
    return f"; cpu={mode}" if mode.startswith("portable") else ""


def _model_canary(method: str) -> str:
    from nlmodels import native_cpu_kernels

    h = hashlib.sha256(f"{_FORMAT}; {_versions()}; {method}".encode())
    # which fast path the eager step runs: native kernels and their torch twins are not
    # bitwise equal, so each has its own fingerprint; so has the portable CPU mode
    h.update(f"native={native_cpu_kernels()}{_cpu_mark()}".encode())
    _train_canary(method, h)
    return h.hexdigest()[:16]


def training_digest(method: str) -> str:
    """The canary training's bytes alone (no versions, modes or format), one torch thread: what
    the tests pin, so a CPU that computes other bytes fails naming the model."""
    h = hashlib.sha256()
    _one_thread(_train_canary, method, h)
    return h.hexdigest()[:16]


def _system_canary(system: str) -> str:
    from datasets import prepare, simulate

    ds = simulate(system, n_trajectories=10, seed=0, noise_std=0.01, workers=1)
    p = prepare(ds, seed=0)
    h = hashlib.sha256(f"{_FORMAT}; {_versions()}; {system}".encode())
    _digest(h, ds.t, ds.x, ds.x_clean, ds.ic, ds.t_physical)
    for s in (p.train, p.val, p.test):
        _digest(h, s.obs_t, s.obs_x, s.query_t, s.target, s.target_clean, s.index, s.ic)
    _digest(h, p.normaliser.mean, p.normaliser.std)
    return h.hexdigest()[:16]


# -- the cache ----------------------------------------------------------------------------------
def _cache_dir() -> Path:
    from datasets import data_home

    return data_home() / "numerics"


def _fingerprint(kind: str, name: str, key: str) -> str:
    memo = (kind, name, key)
    with _MEMO_LOCK:
        if memo in _MEMO:
            return _MEMO[memo]
    path = _cache_dir() / f"{kind}-{name}-{key[:24]}.json"
    try:
        fp = json.loads(path.read_text())["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        fp = None
    if not isinstance(fp, str):
        t0 = time.perf_counter()
        try:
            with contained():  # user code's sys.exit too
                fp = _run_canary(kind, name)
        except Exception as e:
            # The model or simulator fails as it runs: its cells fail on their own, with their
            # error; this fingerprint matches no stored run and is neither cached nor memoised.
            notify_once(
                f"canary:{kind}:{name}",
                f"the numerics canary of {kind} {name} failed ({type(e).__name__}: "
                f"{e}); its cells are not reused by numerics",
            )
            return "failed-" + hashlib.sha256(f"{type(e).__name__}: {e}".encode()).hexdigest()[:9]
        _write(path, {"fingerprint": fp, "seconds": time.perf_counter() - t0, "key": key})
    with _MEMO_LOCK:
        _MEMO[memo] = fp
    return fp


def _one_thread(fn, *args):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reductions split over threads round differently
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def _run_canary(kind: str, name: str) -> str:
    return _one_thread(_model_canary if kind == "model" else _system_canary, name)


def _write(path: Path, record: Mapping[str, object]) -> None:
    """Atomically (two processes racing write the same bytes); a read-only home only costs
    the next start the canary again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as f:
            json.dump(record, f)
        os.replace(f.name, path)
    except OSError as e:
        print(f"nllab: numerics fingerprint not cached ({e})", file=sys.stderr)


def model_fingerprint(method: str) -> str:
    """The numerics fingerprint of model ``method`` (16 hex digits; cached per source state)."""
    return _fingerprint("model", method, _model_source(method))


def system_fingerprint(system: str) -> str:
    """The numerics fingerprint of data set ``system`` (16 hex digits; cached per source
    state)."""
    return _fingerprint("system", system, source_key())


@dataclass(frozen=True)
class CellNumerics:
    """Today's fingerprints of the models and systems of some cells."""

    models: Mapping[str, str]
    systems: Mapping[str, str]


def warm(cells: Iterable) -> CellNumerics:
    """Today's fingerprints of the methods and systems of ``cells`` (computed now if not
    cached, so worker processes then only read them)."""
    cells = list(cells)
    methods = sorted({c.method for c in cells})
    systems = sorted({c.system for c in cells})
    return CellNumerics(
        {m: model_fingerprint(m) for m in methods}, {s: system_fingerprint(s) for s in systems}
    )


def cell_tags(cell) -> dict[str, str]:
    """The ``numerics.model`` and ``numerics.system`` tags of a cell's run."""
    from tasks.tracking.tags import RunTags

    return {
        RunTags.NUMERICS_MODEL: model_fingerprint(cell.method),
        RunTags.NUMERICS_SYSTEM: system_fingerprint(cell.system),
    }


def stale(
    cells: Iterable, records: Mapping[str, object], today: CellNumerics
) -> tuple[set[str], list[str]]:
    """Which stored runs (``records``: config hash → :class:`tasks.tracking.RunRecord`) were
    computed by other numerics than today's: their config hashes, and one line per changed
    model or system (and one for runs stored before fingerprints were recorded)."""
    from tasks.tracking.tags import RunTags

    out: set[str] = set()
    changed: dict[tuple[str, str], list[str]] = {}
    unrecorded = 0
    for c in cells:
        h = c.config_hash()
        record = records.get(h)
        if record is None or h in out:
            continue
        tags = record.tags
        model, system = tags.get(RunTags.NUMERICS_MODEL), tags.get(RunTags.NUMERICS_SYSTEM)
        if model is None or system is None:
            out.add(h)
            unrecorded += 1
            continue
        commit = (tags.get(RunTags.GIT_COMMIT) or "")[:7] or "unknown"
        if model != today.models[c.method]:
            changed.setdefault((c.method, "model"), []).append(commit)
        if system != today.systems[c.system]:
            changed.setdefault((c.system, "data set"), []).append(commit)
        if model != today.models[c.method] or system != today.systems[c.system]:
            out.add(h)
    lines = [
        f"{'' if kind == 'model' else 'the data set '}{name} changed since commit "
        f"{max(set(commits), key=commits.count)}: {len(commits)} "
        f"cell{'s' if len(commits) != 1 else ''} retrained"
        for (name, kind), commits in sorted(changed.items())
    ]
    if unrecorded:
        lines.append(
            f"{unrecorded} finished cell{'s' if unrecorded != 1 else ''} stored without "
            "numerics fingerprints (before they were recorded) retrained; --reuse config "
            "reuses them"
        )
    return out, lines
