"""On-disk cache of simulated data sets.

One ``.npz`` file per fingerprint (system, N, grid, seed, noise and where it is added,
``DATA_VERSION``).  Files are
written to a temporary file in the same folder and moved into place with ``os.replace``, so a
crash never leaves a half-written file under the final name, and a good file is only ever
replaced by another complete one.  Each file stores a sha256 checksum of its arrays; a file that
does not load or does not match is logged and regenerated, never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from datasets._home import CacheError, data_home
from datasets._simulate import (
    Dataset,
    check_workers,
    make_request,
    read_only,
    request_fingerprint,
    simulate_request,
)

logger = logging.getLogger(__name__)

_ARRAYS = ("t", "x", "x_clean", "ic", "t_physical")
#: Temporary files of :func:`_write` (``.<system>-<fingerprint[:32]>-<random>.tmp``).
_TMP_NAME = re.compile(r"\.[a-z0-9_]+-[0-9a-f]{32}-[^/]*\.tmp")
#: A temporary file older than this was left by a killed writer (a write takes seconds).
STALE_TMP_SECONDS = 15 * 60


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in _ARRAYS:
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _read(path: Path, fingerprint: str) -> Dataset:
    """Load and verify one cache file; raises ``ValueError`` on any mismatch."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"][()]))
            arrays = {name: z[name] for name in _ARRAYS}
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as err:
        raise ValueError(f"unreadable ({type(err).__name__}: {err})") from err
    if meta.get("fingerprint") != fingerprint:
        raise ValueError("fingerprint does not match the file name")
    if meta.get("checksum") != _checksum(arrays):
        raise ValueError("checksum mismatch")
    return Dataset(
        system=meta["system"],
        **{name: read_only(arrays[name]) for name in _ARRAYS},
        seed=int(meta["seed"]),
        noise_std=float.fromhex(meta["noise_std"]),
        fingerprint=fingerprint,
        noise_on=meta.get("noise_on", "raw"),  # files from before the setting: raw
    )


def _write(path: Path, ds: Dataset) -> None:
    arrays = {name: getattr(ds, name) for name in _ARRAYS}
    meta = {
        "fingerprint": ds.fingerprint,
        "system": ds.system,
        "seed": ds.seed,
        "noise_std": float(ds.noise_std).hex(),
        "checksum": _checksum(arrays),
    }
    if ds.noise_on != "raw":
        meta["noise_on"] = ds.noise_on
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, meta=np.array(json.dumps(meta)), **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remove_stale_tmp(folder: Path) -> None:
    """Delete the temporary files that killed writers left in ``folder`` (only files named as
    :func:`_write` names them, and older than ``STALE_TMP_SECONDS``: a live write is kept)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    cutoff = time.time() - STALE_TMP_SECONDS
    for e in entries:
        try:
            if _TMP_NAME.fullmatch(e.name) and e.is_file() and e.stat().st_mtime < cutoff:
                os.unlink(e.path)
                logger.info("removed %s, left by an interrupted cache write", e.path)
        except OSError:
            pass  # removed by another process meanwhile, or not ours to remove


def load_or_simulate(
    system: str,
    n_trajectories: int | None = None,
    n_points: int | None = None,
    seed: int = 0,
    noise_std: float = 0.0,
    cache_dir: str | Path | None = None,
    *,
    noise_on: str = "raw",
    workers: int | None = None,
) -> Dataset:
    """``simulate(...)`` through the on-disk cache (default folder ``data_home() / "cache"``).

    A cache hit returns arrays identical to a fresh simulation.  A corrupted or mismatching file is
    logged as a warning and regenerated.

    Raises:
        ValueError: invalid arguments (as ``simulate``).
        CacheError: the cache directory cannot be created or written.
    """
    req = make_request(system, n_trajectories, n_points, seed, noise_std, noise_on)
    workers = check_workers(workers)
    fingerprint = request_fingerprint(req)
    folder = Path(cache_dir).expanduser() if cache_dir is not None else data_home() / "cache"
    path = folder / f"{req.system}-{fingerprint[:32]}.npz"
    _remove_stale_tmp(folder)
    if path.is_file():
        try:
            return _read(path, fingerprint)
        except ValueError as err:
            logger.warning("cache file %s is corrupted (%s); regenerating it", path, err)
    # Check the folder before the (possibly long) simulation, so a bad cache_dir fails fast.
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.TemporaryFile(dir=folder)
        probe.close()
    except OSError as err:
        raise CacheError(
            f"cache directory {str(folder)!r} is not writable ({err.strerror or err}); pass "
            "cache_dir=<a writable folder> or set NLLAB_HOME"
        ) from err
    ds = simulate_request(req, workers)
    try:
        _write(path, ds)
    except OSError as err:
        raise CacheError(f"could not write cache file {str(path)!r}: {err}") from err
    return ds
