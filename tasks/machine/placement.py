"""Where a pack of cells trains, and how many cells a GPU pack holds: measured, not assumed.

Small models can train slower on a GPU than on one CPU core (every step launches many tiny
kernels and waits on the host), and a pack of 30 members replayed from a CUDA graph costs a
fraction per cell of a pack of 5. So ``--device auto`` times the step each pack will really run
(:func:`probe_pack`: ``nltrain.train_packed`` of the pack's member count, at its cells'
shapes; CUDA graphs on CUDA, the native kernels on the CPU where they apply) on both devices and
picks the faster (:func:`place_pack`); on CUDA, :func:`gpu_pack_size` sizes packs by the
measured memory per member and the measured seconds per cell-epoch.

Measurements are cached per machine (host, CPU, GPU, torch version) in
``$NLLAB_HOME/placement.json``, so each kind of pack is probed once per machine. Concurrent
processes share it safely: a writer holds an exclusive ``flock`` while it reads, probes, merges
its entries into what is on disk and replaces the file, so no writer drops another's entries.

Without CUDA nothing is measured: every pack trains on the CPU and pack composition depends on
the configuration alone.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import math
import multiprocessing
import os
import platform
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
import torch

from nltrain import TrainResult, seeded, select_device
from tasks.config import CellConfig
from tasks.machine._probe_cache import locked, merge_entries, read_entries

__all__ = [
    "MAX_PACK_MEMBERS",
    "MEMORY_SHARE",
    "PROBE_EPOCHS",
    "CpuProbesAhead",
    "Probe",
    "ProbeOptions",
    "cached_probe",
    "cell_shapes",
    "choose_fastest",
    "gpu_pack_size",
    "machine_fingerprint",
    "place_cell",
    "place_pack",
    "probe_pack",
    "split_evenly",
]

#: Epochs each probe trains: the first warms up (allocations, graph capture), the last is timed.
PROBE_EPOCHS = 2
#: The largest pack :func:`gpu_pack_size` forms (beyond it a GPU is long saturated).
MAX_PACK_MEMBERS = 64
#: Share of the GPU's free memory the packs of all GPU lanes may take together.
MEMORY_SHARE = 0.5
#: A smaller pack is chosen only when it is measured this much cheaper per cell-epoch.
SMALLER_PACK_MARGIN = 0.9
_CACHE_FILE = "placement.json"


@dataclass(frozen=True)
class Probe:
    """One measured pack: seconds per cell-epoch (at the cells' real training-set size) and the
    peak device memory one member takes (CUDA; 0 where not measured)."""

    seconds: float
    bytes_per_member: int = 0


#: ``measure(cell, device, members)``: the step a pack of ``members`` cells like ``cell`` runs.
Measure = Callable[[CellConfig, torch.device, int], Probe | float]


class ProbeOptions(TypedDict):
    """Where probes are cached and what measures them (:func:`cached_probe`'s keywords)."""

    cache_dir: Path | None
    measure: Measure | None


def _gpu_name() -> str:
    # The driver's own listing first: asking torch would start CUDA in every worker process
    # (a CPU pack's worker included) just to read a name.
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            break
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


@functools.lru_cache(maxsize=1)
def machine_fingerprint() -> str:
    """What the measurement depends on: host, CPU, GPU and torch build."""
    gpu = _gpu_name()
    parts = (platform.node(), platform.processor(), str(os.cpu_count()), gpu, torch.__version__)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def choose_fastest(seconds: Mapping[str, float]) -> str:
    """The device with the smallest measured step time (ties: the first given)."""
    if not seconds:
        raise ValueError("no device was measured")
    return min(seconds, key=lambda d: seconds[d])


def cell_shapes(cell: CellConfig) -> dict[str, int]:
    """Training/validation trajectories, observed and predicted points and state dimension of
    ``cell``'s split, from its configuration alone (no data is simulated)."""
    from datasets import split_sizes
    from tasks.config.declarations import system_info

    info = system_info(cell.system, cell.data)
    d = cell.data
    n_all = d.n_trajectories or info.default_trajectories
    n_points = d.n_points or info.default_points
    n_obs = d.n_observed or n_points // 2
    n_train, n_val, _ = split_sizes(n_all, tuple(d.fractions))
    if d.n_train is not None:
        n_train = min(n_train, d.n_train)
    return {
        "n_train": n_train,
        "n_val": n_val,
        "n_obs": n_obs,
        "n_query": n_points - n_obs,
        "state_dim": info.state_dim,
    }


def _synthetic_split(n: int, n_obs: int, n_query: int, dim: int, seed: int):
    from datasets import SplitData

    t = np.linspace(0.1, 1.0, n_obs + n_query)
    x = np.random.default_rng(seed).standard_normal((n, n_obs + n_query, dim))
    return SplitData.from_trajectories(t, x, n_obs)


def probe_pack(cell: CellConfig, device: torch.device, members: int = 1) -> Probe:
    """Time the training a pack of ``members`` cells like ``cell`` really runs on ``device``.

    ``nltrain.train_packed`` of ``members`` models of the cell's method on synthetic
    splits of the cell's shapes (one training batch and at most one validation batch per
    epoch), :data:`PROBE_EPOCHS` epochs: whatever that path runs (CUDA graphs, the native CPU
    kernels, one by one for models that do not pack or that prefer it there:
    :func:`nltrain.prefers_one_by_one`) is what is timed. The last epoch's time,
    per member, scaled by the cell's real number of training batches, is the cost of one
    cell-epoch; on CUDA the peak memory of the run, per member, plus the rest of the cell's data.
    """
    device = torch.device(device)
    s = cell_shapes(cell)
    batch = min(cell.training.batch_size, s["n_train"])
    n_val = min(s["n_val"], batch)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    try:
        results = _probe_run(cell, device, members, s, batch, n_val)
    except Exception:  # e.g. out of memory: this device cannot run the pack (the cell, if it
        if cuda:  # cannot run anywhere, fails on its own with its error)
            torch.cuda.empty_cache()
        return Probe(math.inf)
    trained = [r for r in results if isinstance(r, TrainResult)]
    if not trained:
        return Probe(math.inf)
    if trained[0].packed_members > 1:  # one pack: each member's epoch time is the pack's
        epoch = trained[0].history[-1].seconds / members
    else:  # one by one: each member's own epochs
        epoch = sum(r.history[-1].seconds for r in trained) / len(trained)
    steps = math.ceil(s["n_train"] / batch)
    per_member = 0
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) - base
        itemsize = 8 if cell.training.dtype == "float64" else 4
        rest = (s["n_train"] - batch + s["n_val"] - n_val) * (s["n_obs"] + s["n_query"])
        per_member = max(0, peak) // members + rest * s["state_dim"] * itemsize
    del results, trained
    if cuda:  # the planning process trains nothing itself: give the probe's memory back
        gc.collect()
        torch.cuda.empty_cache()
    return Probe(epoch * steps, int(per_member))


def _probe_run(
    cell: CellConfig, device: torch.device, members: int, s: dict, batch: int, n_val: int
) -> list:
    """The probe's training: ``members`` fresh models of the cell's method, one batch each."""
    from nlmodels import build_model
    from nltrain import prefers_one_by_one, train_packed

    models = []
    for seed in range(members):
        with seeded(seed):
            models.append(build_model(cell.method, s["state_dim"], **cell.model))
    return train_packed(
        models,
        [_synthetic_split(batch, s["n_obs"], s["n_query"], s["state_dim"], 0)] * members,
        [_synthetic_split(n_val, s["n_obs"], s["n_query"], s["state_dim"], 1)] * members,
        cell.training.fixed_epochs(PROBE_EPOCHS),
        device=device,
        seeds=list(range(members)),
        # what the cells will run: one by one where packing is slower (the engine splits
        # such a pack on the CPU, and its worker trains it so)
        pack=not prefers_one_by_one(models[0], device),
    )


def _cache_path(cache_dir: Path | None) -> Path:
    from datasets import data_home

    return (Path(cache_dir) if cache_dir is not None else data_home()) / _CACHE_FILE


def _probe_key(cell: CellConfig, members: int) -> str:
    # The measurement depends on the model, the shapes, the member count and the CPU threads
    # (the engine probes with the workers' count), not on the seed or the data values; and on
    # the step the probe runs ("step": 2 since the Latent ODE's pack is captured on CUDA).
    payload = {
        "step": 2,
        "threads": torch.get_num_threads(),
        "method": cell.method,
        "model": cell.model,
        "shapes": cell_shapes(cell),
        "batch_size": cell.training.batch_size,
        "dtype": cell.training.dtype,
        "grad_clip": cell.training.grad_clip,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    return f"{machine_fingerprint()}/{digest}/x{members}"


def cached_probe(
    cell: CellConfig,
    members: int,
    devices: tuple[str, ...] = ("cpu", "cuda"),
    *,
    cache_dir: Path | None = None,
    measure: Measure | None = None,
) -> dict[str, float]:
    """``{device: seconds per cell-epoch, device_bytes: bytes per member}`` of a pack of
    ``members`` cells like ``cell``, from the cache or measured (:func:`probe_pack`) and cached.
    Only the devices missing from the cache are measured."""
    path = _cache_path(cache_dir)
    key = _probe_key(cell, members)
    entry = read_entries(path).get(key, {})
    if all(d in entry for d in devices):
        return entry
    with locked(path):
        entry = read_entries(path).get(key, {})  # another process may have measured it meanwhile
        new: dict[str, float] = {}
        for d in devices:
            if d in entry:
                continue
            got = (measure or probe_pack)(cell, torch.device(d), members)
            probe = got if isinstance(got, Probe) else Probe(float(got))
            new[d] = probe.seconds
            if probe.bytes_per_member:
                new[f"{d}_bytes"] = probe.bytes_per_member
        merge_entries(path, {key: new})
    return {**entry, **new}


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _init_probe_process(threads: int) -> None:
    import signal

    import nlmodels

    # a terminal's Ctrl-C reaches the whole process group: the planning process stops the pool,
    # ending each probe by SIGTERM, on which it exits as Python does (its exit handlers
    # release what it registered with the shared resource tracker)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_term)

    nlmodels.set_up_numerics()  # the parent's CPU numerics (its environment is inherited)
    torch.set_num_threads(threads)


def _cpu_probe_seconds(cell: CellConfig, members: int) -> float:
    return probe_pack(cell, torch.device("cpu"), members).seconds


class CpuProbesAhead:
    """CPU probes (:func:`probe_pack`) measured in spawned processes while the caller goes on
    probing the GPU; on leaving the block their results join the cache, where
    :func:`cached_probe` then finds them.

    On a GPU node the planning of a benchmark otherwise probes every kind of pack on the GPU
    and then on one CPU core, one after another in one process, while the cores that will
    train the CPU packs stand idle. A probe that fails in its process (or a process that dies)
    leaves its entry out; :func:`cached_probe` measures it in-process as before. Probes run with
    this process's torch thread count (part of the cache key), ``processes`` at once (default:
    as many as the usable cores less one, kept for the GPU probes, hold at that thread count);
    where that is none, nothing is measured ahead.
    """

    def __init__(self, cache_dir: Path | None = None, processes: int | None = None) -> None:
        from tasks.machine.workers import usable_cores

        self._path = _cache_path(cache_dir)
        spare = (usable_cores() - 1) // max(1, torch.get_num_threads())  # not oversubscribed
        self._processes = spare if processes is None else processes
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[str, Future] = {}

    def submit(self, cell: CellConfig, members: int) -> None:
        """Measure a pack of ``members`` cells like ``cell`` on the CPU, unless it is cached or
        already on its way."""
        key = _probe_key(cell, members)
        if (
            self._processes < 1
            or key in self._pending
            or "cpu" in read_entries(self._path).get(key, {})
        ):
            return
        if self._pool is None:  # 'spawn': the caller has threads and may hold CUDA
            self._pool = ProcessPoolExecutor(
                self._processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_probe_process,
                initargs=(torch.get_num_threads(),),
            )
        self._pending[key] = self._pool.submit(_cpu_probe_seconds, cell, members)

    def __enter__(self) -> CpuProbesAhead:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self._pool is None:
            return
        if exc_type is not None:
            self._stop()
            return
        measured = {}
        try:
            for key, future in self._pending.items():
                try:
                    seconds = future.result()
                except Exception:  # measured again in-process by cached_probe
                    continue
                if math.isfinite(seconds):
                    measured[key] = {"cpu": seconds}
        except BaseException:  # Ctrl-C while waiting for them
            self._stop()
            raise
        self._pool.shutdown()
        with locked(self._path):
            merge_entries(self._path, measured)

    def _stop(self) -> None:
        """Interrupted: nothing queued starts, and the running probes end now (the pool would
        otherwise let them finish, and the interpreter wait for them at exit)."""
        assert self._pool is not None
        processes = list(getattr(self._pool, "_processes", {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(5)
            if process.is_alive():  # stuck where SIGTERM waits: not worth the user's wait
                process.kill()
                process.join()


def _has_cuda(cuda_available: bool | None) -> bool:
    return torch.cuda.is_available() if cuda_available is None else cuda_available


def place_pack(
    cells: list[CellConfig],
    requested: str,
    *,
    cache_dir: Path | None = None,
    measure: Measure | None = None,
    cuda_available: bool | None = None,
) -> torch.device:
    """The device a pack of ``cells`` (one :func:`tasks.cell.pack_key`) trains on: ``cpu`` /
    ``cuda`` as asked; ``auto`` the faster of the two for this pack's member count, as measured
    on this machine (:func:`cached_probe`); the CPU without CUDA, measuring nothing."""
    if requested != "auto":
        return select_device(requested)
    if not _has_cuda(cuda_available):
        return torch.device("cpu")
    timed = cached_probe(cells[0], len(cells), cache_dir=cache_dir, measure=measure)
    return torch.device(choose_fastest({d: timed[d] for d in ("cpu", "cuda")}))


def place_cell(
    cell: CellConfig,
    requested: str,
    *,
    cache_dir: Path | None = None,
    measure: Measure | None = None,
    cuda_available: bool | None = None,
) -> torch.device:
    """:func:`place_pack` of one cell trained alone."""
    return place_pack(
        [cell], requested, cache_dir=cache_dir, measure=measure, cuda_available=cuda_available
    )


def _free_gpu_bytes() -> int:
    free, _total = torch.cuda.mem_get_info()
    return int(free)


def gpu_pack_size(
    cell: CellConfig,
    group_size: int,
    *,
    lanes: int = 1,
    cache_dir: Path | None = None,
    measure: Measure | None = None,
    free_bytes: int | None = None,
) -> int:
    """How many of ``group_size`` cells like ``cell`` one CUDA pack should hold.

    The memory one member takes is measured on a small pack (at most 4 members); the packs of
    ``lanes`` GPU lanes together may take :data:`MEMORY_SHARE` of the free GPU memory, and a pack
    at most :data:`MAX_PACK_MEMBERS`. The largest such pack is compared with one half its size
    (both measured): bigger packs are cheaper per cell as long as the GPU is not saturated, so
    the smaller one wins only when it is measured clearly (:data:`SMALLER_PACK_MARGIN`) cheaper
    per cell-epoch.
    """
    if group_size <= 1:
        return max(group_size, 1)
    kw: ProbeOptions = {"cache_dir": cache_dir, "measure": measure}
    small = min(group_size, 4)
    per_member = int(cached_probe(cell, small, ("cuda",), **kw).get("cuda_bytes", 0))
    cap = MAX_PACK_MEMBERS
    if per_member > 0:
        free = _free_gpu_bytes() if free_bytes is None else free_bytes
        cap = min(cap, max(1, int(free * MEMORY_SHARE / max(lanes, 1) // per_member)))
    big = min(group_size, cap)
    half = math.ceil(big / 2)
    if half <= 1 or half == big:
        return big
    # the per-cell cost of the pack sizes the group really splits into
    big_size, half_size = _even_size(group_size, big), _even_size(group_size, half)
    cost_big = cached_probe(cell, big_size, ("cuda",), **kw)["cuda"]
    cost_half = cached_probe(cell, half_size, ("cuda",), **kw)["cuda"]
    return half if cost_half < SMALLER_PACK_MARGIN * cost_big else big


def _even_size(n: int, most: int) -> int:
    """The largest pack of ``n`` cells split evenly into packs of at most ``most``."""
    return math.ceil(n / math.ceil(n / most))


def split_evenly(items: list, most: int) -> list[list]:
    """``items`` in order, in the fewest consecutive chunks of at most ``most``, whose sizes
    differ by one at most (so a group of 30 with room for 16 is two packs of 15)."""
    if most < 1:
        raise ValueError(f"a pack holds at least one cell, got {most}")
    n_chunks = math.ceil(len(items) / most) if items else 0
    out, start = [], 0
    for i in range(n_chunks):
        size = len(items) // n_chunks + (i < len(items) % n_chunks)
        out.append(items[start : start + size])
        start += size
    return out
