"""The cell engine: the one path from a list of cells to their results.

The benchmark, every study, reproduction and the cells of a tuning trial go through it. Given
cells and a :class:`~tasks.cell.CellRuntime`, :func:`run_cells`

1. reuses every cell that already has a FINISHED run with its config hash (never retrained;
   :func:`tasks.machine.reuse.stored_results`, the one answer to "is this cell done?");
2. simulates each needed data set once, before training starts;
3. groups the rest into packs (cells whose tensors have the same shapes:
   :func:`tasks.cell.pack_key`), each trained as one batched model when ``runtime.pack`` is on;
   with CUDA present and ``--device auto``/``cuda``, big groups are split into packs sized by
   GPU memory and measured throughput, and under ``auto`` each pack is placed on the device
   measured faster for it (:func:`plan_packs`, :mod:`tasks.machine.placement`);
4. fans the packs out over the flow's task runner (threads, worker processes or Dask), one
   Prefect task per pack and one MLflow child run per cell; GPU packs go to at most
   :data:`GPU_LANES` lanes at once while the other workers train CPU packs
   (:func:`in_lanes`), so neither waits behind the other;
5. calls ``on_finished`` with each pack's results as the pack ends (a caller that records cells
   as they finish, e.g. the results ledger), and returns one :class:`~tasks.results.CellResult`
   per input cell, in input order.

Stopping: setting ``runtime.stop`` (the one stop mechanism; Ctrl-C sets it too) stops every
running cell at its next batch, in worker processes as well (their runs end KILLED, their
results ``interrupted``); packs not yet started return ``interrupted`` without starting, and
:func:`run_cells` returns normally with the finished cells' results.

It must be called inside a Prefect flow (it submits tasks to the flow's task runner).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

import torch
from prefect import get_run_logger
from prefect.futures import PrefectFuture, as_completed
from tqdm.contrib.logging import logging_redirect_tqdm

from nltrain import torch_threads
from tasks.cell import CellRuntime, pack_key, stored_results
from tasks.config import CellConfig, RunConfig
from tasks.machine.balance import GPU_LANES, PackOption, balance_devices, busy_seconds
from tasks.machine.placement import (
    CpuProbesAhead,
    Measure,
    ProbeOptions,
    cached_probe,
    gpu_pack_size,
    place_pack,
    split_evenly,
)
from tasks.machine.workers import worker_pool_active, worker_processes, worker_threads
from tasks.prefect_tasks import PackFailed, pack_task, simulate_data_sets
from tasks.progress import Display
from tasks.reports import plural
from tasks.results import CellResult, by_config_hash
from tasks.stopping import contained, stop_signals

__all__ = [
    "CPU_PACK_MEMBERS",
    "GPU_LANES",
    "PackEstimate",
    "busy_seconds",
    "collect_results",
    "estimate_packs",
    "in_lanes",
    "make_packs",
    "packability_memo",
    "plan_packs",
    "run_cells",
    "stored_results",
]

#: The most cells one CPU pack holds (the packs on a machine without CUDA, or under
#: ``--device cpu``): a constant, so that the packs, and hence the table, depend on the
#: configuration only, never on the machine (workers, timings). Packing on the CPU saves
#: per-operation overhead only; bigger packs would only hold one worker longer.
CPU_PACK_MEMBERS = 5


def _packable(cell: CellConfig, device: str = "cpu") -> bool:
    """Whether the cell's model trains packed on ``device`` (else its seeds spread over the
    workers): :func:`nltrain.packable` and not :func:`nltrain.prefers_one_by_one` there (Neural
    Laplace, and the paper profile's NODE and ANODE through the adjoint, pack on CUDA only)."""
    from nlmodels import build_model
    from nltrain import packable, prefers_one_by_one
    from tasks.config.declarations import system_info

    dev = torch.device(device)
    try:
        with contained():  # a plugin's sys.exit, too: the cell fails on its own when it runs
            dim = system_info(cell.system, cell.data).state_dim
            model = build_model(cell.method, dim, **cell.model)
            return packable(model, dev) and not prefers_one_by_one(model, dev)
    except Exception:
        return False  # the cell fails on its own, with its error, when it runs


def packability_memo(device: str = "cpu") -> Callable[[CellConfig], bool]:
    """:func:`_packable` on ``device`` remembered by what it depends on (method, state dimension,
    model settings), for planning many groups at once: each answer builds and probes a model."""
    from tasks.config.declarations import system_info

    answers: dict[tuple[str, int, str], bool] = {}

    def packable(cell: CellConfig) -> bool:
        try:
            dim = system_info(cell.system, cell.data).state_dim
        except Exception:
            return False  # (as _packable says: the cell fails on its own when it runs)
        key = (cell.method, dim, json.dumps(cell.model, sort_keys=True))
        return answers[key] if key in answers else answers.setdefault(key, _packable(cell, device))

    return packable


def make_packs(
    cells: Sequence[CellConfig],
    pack: bool,
    *,
    pack_size: Callable[[list[CellConfig]], int] | None = None,
    device: str = "cpu",
    packable: Callable[[CellConfig], bool] | None = None,
) -> list[list[CellConfig]]:
    """Cells grouped by :func:`~tasks.cell.pack_key` (first-appearance order) where their model
    trains packed on ``device`` (:func:`_packable`, or ``packable``: a :func:`packability_memo`);
    one cell per pack otherwise, or when ``pack`` is off, so that cells that would train one by
    one spread over the workers instead.

    ``pack_size(group)``: the most cells one pack of that group may hold (default
    :data:`CPU_PACK_MEMBERS`); the group is then split into the fewest packs of near-equal size
    (:func:`tasks.machine.placement.split_evenly`).
    """
    if not pack:
        return [[c] for c in cells]
    trains_packed = packable or (lambda cell: _packable(cell, device))
    groups: dict[str, list[CellConfig]] = {}
    for c in cells:
        groups.setdefault(pack_key(c), []).append(c)
    packs: list[list[CellConfig]] = []
    for group in groups.values():
        if len(group) > 1 and trains_packed(group[0]):
            most = CPU_PACK_MEMBERS if pack_size is None else pack_size(group)
            packs += split_evenly(group, most)
        else:
            packs += [[c] for c in group]
    return packs


def plan_packs(
    cells: Sequence[CellConfig],
    *,
    pack: bool,
    device: str,
    cache_dir: Path | None = None,
    lanes: int = GPU_LANES,
    workers: int | None = None,
    measure: Measure | None = None,
    cuda_available: bool | None = None,
    free_bytes: int | None = None,
) -> list[tuple[list[CellConfig], str]]:
    """The packs ``cells`` train in, each with the device it trains on (``cpu``/``cuda``).

    Without CUDA (or with ``device="cpu"``) this measures nothing: :func:`make_packs` as is,
    every pack on the CPU. With CUDA and ``device`` ``auto`` or ``cuda``, packable groups are
    split by :func:`tasks.machine.placement.gpu_pack_size` (``lanes`` packs share the GPU's memory);
    under ``auto`` each pack then goes where :func:`tasks.machine.placement.place_pack` measured it
    faster (the CPU side measured as it would run there: one by one for a model that prefers
    it, :func:`nltrain.prefers_one_by_one`; such a pack placed on the CPU is then split
    into single cells, which spread over the workers; with the real probes, the CPU side of
    each pack is measured in other processes while the GPU is probed:
    :class:`tasks.machine.placement.CpuProbesAhead`); given ``workers``, the packs then move
    between the devices while that shortens the whole plan (:func:`_placed`: the GPU's packs
    add up, the CPU's spread over the workers). ``measure``/``cuda_available``/
    ``free_bytes`` replace the probes, CUDA's presence and the free GPU memory (tests,
    projections).
    """
    has_cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if device == "cpu" or not has_cuda:  # ("cuda" without CUDA: each cell fails, saying so)
        return [(p, "cpu") for p in make_packs(cells, pack)]

    # under auto the CPU side of each pack is measured in other processes meanwhile
    ahead = CpuProbesAhead(cache_dir) if device == "auto" and measure is None else None

    def size(group: list[CellConfig]) -> int:
        most = gpu_pack_size(
            group[0], len(group), lanes=lanes, cache_dir=cache_dir, measure=measure,
            free_bytes=free_bytes,
        )  # fmt: skip
        if ahead is not None:
            for p in split_evenly(group, most):
                ahead.submit(p[0], len(p))
        return most

    with ahead or nullcontext():
        packs = make_packs(cells, pack, pack_size=size, device="cuda")
    if device == "cuda":
        return [(p, "cuda") for p in packs]
    return _placed(packs, workers, lanes, cache_dir, measure)


def _placed(
    packs: list[list[CellConfig]],
    workers: int | None,
    lanes: int,
    cache_dir: Path | None,
    measure: Measure | None,
) -> list[tuple[list[CellConfig], str]]:
    """``packs`` under ``auto``: each on its faster device
    (:func:`tasks.machine.placement.place_pack`), then, given ``workers``, the plan that finishes
    first from there (:func:`tasks.machine.balance.balance_devices`); a pack placed on the CPU
    whose model trains one by one there split into single cells."""
    kw: ProbeOptions = {"cache_dir": cache_dir, "measure": measure}
    where = [place_pack(p, "auto", cuda_available=True, **kw).type for p in packs]
    split = [len(p) > 1 and not _packable(p[0], "cpu") for p in packs]
    if workers is not None:
        options = []
        for p, one_by_one in zip(packs, split, strict=True):
            probe, epochs = cached_probe(p[0], len(p), **kw), p[0].training.epochs
            per_cell = probe["cpu"] * epochs
            cpu = (per_cell,) * len(p) if one_by_one else (per_cell * len(p),)
            options.append(PackOption(probe["cuda"] * len(p) * epochs, cpu))
        where = balance_devices(options, where, workers, lanes)
    placed: list[tuple[list[CellConfig], str]] = []
    for p, d, one_by_one in zip(packs, where, split, strict=True):
        placed += [([c], "cpu") for c in p] if d == "cpu" and one_by_one else [(p, d)]
    return placed


@dataclass(frozen=True)
class PackEstimate:
    """A pack as :func:`plan_packs` plans it, with the seconds it is expected to train."""

    cells: tuple[CellConfig, ...]
    device: str
    seconds: float


def estimate_packs(
    config: RunConfig,
    *,
    cache_dir: Path | None = None,
    measure: Measure | None = None,
    cuda_available: bool | None = None,
    free_bytes: int | None = None,
) -> list[PackEstimate]:
    """``config``'s cells planned as :func:`run_cells` plans them under its execution settings
    (:func:`plan_packs`), each pack with its training seconds at its cells' epoch ceiling: the
    seconds per cell-epoch this machine measured for a pack of that size on that device
    (:func:`tasks.machine.placement.cached_probe`: the probes the engine's planning takes and caches
    itself, with the workers' thread count) × members × epochs. Early stopping only shortens
    it. ``measure``/``cuda_available``/``free_bytes`` as :func:`plan_packs`."""
    ex = config.execution
    with torch_threads(worker_threads(ex.torch_threads, ex.max_workers)):
        planned = plan_packs(
            config.cells(),
            pack=ex.pack,
            device=ex.device,
            cache_dir=cache_dir,
            workers=ex.max_workers,
            measure=measure,
            cuda_available=cuda_available,
            free_bytes=free_bytes,
        )
        out = []
        for p, where in planned:
            probe = cached_probe(p[0], len(p), (where,), cache_dir=cache_dir, measure=measure)
            out.append(PackEstimate(tuple(p), where, probe[where] * len(p) * p[0].training.epochs))
    return out


def in_lanes(
    packs: Sequence[tuple[list[CellConfig], str]],
    submit: Callable[[list[CellConfig]], PrefectFuture],
    max_workers: int,
    lanes: int = GPU_LANES,
    first_done: Callable[[list[PrefectFuture]], PrefectFuture] | None = None,
) -> Iterator[tuple[PrefectFuture, list[CellConfig]]]:
    """Submit ``packs`` (pack, device) so that at most ``max_workers`` run at once, of which at
    most ``lanes`` are CUDA packs (one fewer than ``max_workers`` while CPU packs wait, so
    these always have a worker): CUDA packs in their lanes, CPU packs on the other workers,
    neither queued behind the other. Yields each (future, pack) as it completes.
    ``first_done(futures)`` blocks until one of them is done and returns it."""
    if first_done is None:
        first_done = lambda fs: next(as_completed(fs))  # noqa: E731
    gpu = deque(p for p, d in packs if d == "cuda")
    cpu = deque(p for p, d in packs if d != "cuda")
    running: dict[PrefectFuture, tuple[list[CellConfig], bool]] = {}
    while gpu or cpu or running:
        n_gpu = sum(on_gpu for _, on_gpu in running.values())
        limit = min(lanes, max_workers - 1 if cpu and max_workers > 1 else max_workers)
        while gpu and n_gpu < limit and len(running) < max_workers:
            p = gpu.popleft()
            running[submit(p)] = (p, True)
            n_gpu += 1
        while cpu and len(running) < max_workers:
            p = cpu.popleft()
            running[submit(p)] = (p, False)
        done = first_done(list(running))
        yield done, running.pop(done)[0]


def collect_results(future: PrefectFuture, pack: Sequence[CellConfig]) -> list[CellResult]:
    """The results of a pack's task; a crashed or cancelled task fails each of its cells."""
    try:
        value = future.result(raise_on_failure=False)
    except Exception as e:  # a crashed task whose state has no data
        value = e
    if isinstance(value, PackFailed):
        return list(value.results)
    if isinstance(value, list) and all(isinstance(r, CellResult) for r in value):
        return value
    # The task itself broke (e.g. the tracking store went away mid-cell).
    return [CellResult.failed(c, "failed", str(value)) for c in pack]


def run_cells(
    cells: Sequence[CellConfig],
    runtime: CellRuntime,
    *,
    reused: Sequence[CellResult] | None = None,
    on_finished: Callable[[Sequence[CellResult]], None] | None = None,
) -> list[CellResult]:
    """Train (or reuse, by config hash) ``cells``: one result per cell, in input order.

    Cells with the same config hash share one run. Failed or interrupted cells are run again next
    time; a failing cell never stops the others. Ctrl-C or SIGTERM stops running cells at their
    next batch (their runs end KILLED), abandons a running simulation, and the signal
    propagates; ``runtime.stop`` set from elsewhere (a deadline) stops them the same way and
    returns. ``reused``: the results :func:`stored_results`
    already gave for these cells in this command (the store is then not asked again; a cell
    finished meanwhile by another process is still reused, under its claim).
    ``on_finished(results)``: called in this thread with each pack's results as it ends
    (finished, failed and interrupted alike); an exception it raises is logged, and training
    goes on.
    """
    unique = list({c.config_hash(): c for c in cells}.values())
    reused, todo = _reused(unique, runtime, reused)
    by_hash = by_config_hash(reused)
    placed = _plan(unique, len(reused), todo, runtime)
    if todo:
        display = Display(runtime.progress, len(todo), len(reused))
        if display.lines:  # no bars in the workers either
            runtime = replace(runtime, progress=False)
        if runtime.stop is None and runtime.task_runner == "thread":  # a caller without one
            runtime = replace(runtime, stop=threading.Event())
        with display, _stopping(runtime):
            no_data = simulate_data_sets(todo, runtime.stop)  # failed: each with its line
            by_hash.update(by_config_hash(no_data))
            placed = [(p, d) for p, d in ((_left(p, by_hash), d) for p, d in placed) if p]
            display.training_started()
            if no_data:
                display.pack_finished(no_data, by_hash.values())
            # the workers' torch threads once around every pack (cells in threads of this
            # process), and this process's own put back afterwards
            with _training(runtime), torch_threads(runtime.cpu_threads()):
                for fut, pack in _submitted(placed, runtime):
                    done = collect_results(fut, pack)
                    by_hash.update(by_config_hash(done))
                    display.pack_finished(done, by_hash.values())
                    _tell_finished(on_finished, done)
        for c in todo:
            by_hash.setdefault(
                c.config_hash(), CellResult.failed(c, "failed", "the cell's task did not return")
            )
    return [by_hash[c.config_hash()] for c in cells]


def _tell_finished(
    on_finished: Callable[[Sequence[CellResult]], None] | None, done: list[CellResult]
) -> None:
    if on_finished is None:
        return
    try:
        on_finished(done)
    except Exception as e:  # the cells are in the store whatever the hook does
        get_run_logger().warning(
            "the cell-finished hook failed for %s: %s: %s",
            ", ".join(r.key for r in done),
            type(e).__name__,
            e,
        )


def _reused(
    unique: list[CellConfig], runtime: CellRuntime, reused: Sequence[CellResult] | None
) -> tuple[list[CellResult], list[CellConfig]]:
    """The stored results of ``unique`` (``reused``, if the command already asked) and the
    cells still to train."""
    if reused is None:
        return stored_results(runtime.queries(), unique, runtime.reuse, device=runtime.device)
    wanted = {c.config_hash() for c in unique}
    mine = [r for r in reused if r.config_hash in wanted]
    known = {r.config_hash for r in mine}
    return mine, [c for c in unique if c.config_hash() not in known]


def _plan(
    unique: list[CellConfig], n_reused: int, todo: list[CellConfig], runtime: CellRuntime
) -> list[tuple[list[CellConfig], str]]:
    """:func:`plan_packs` of ``todo``, said in one log line (with the seconds the planning
    took where it may measure: on a fresh GPU machine its probes take minutes)."""
    t0 = time.perf_counter()
    with torch_threads(runtime.cpu_threads()):  # probes run with the workers' thread count
        placed = plan_packs(
            todo,
            pack=runtime.pack,
            device=runtime.device,
            cache_dir=runtime.cache_dir,
            workers=runtime.max_workers,
        )
    measured = runtime.device != "cpu" and torch.cuda.is_available()
    get_run_logger().info(
        "%s: %d already finished (reused), %d to run in %s (%d on CUDA%s), "
        "%d at a time; tracking at %s",
        plural(len(unique), "cell"),
        n_reused,
        len(todo),
        plural(len(placed), "pack"),
        sum(d == "cuda" for _, d in placed),
        f"; planned in {time.perf_counter() - t0:.0f} s" if measured else "",
        runtime.max_workers,
        runtime.tracking.tracking_uri,
    )
    return placed


def _submitted(
    placed: list[tuple[list[CellConfig], str]], runtime: CellRuntime
) -> Iterator[tuple[PrefectFuture, list[CellConfig]]]:
    """Each pack submitted as a task, yielded (future, pack) as it completes: under ``auto``
    with CUDA packs, GPU packs in their lanes and CPU packs on the other workers
    (:func:`in_lanes`); otherwise all at once."""
    where = {id(p): d for p, d in placed}

    def submit(p: list[CellConfig]) -> PrefectFuture:
        # Under auto each pack runs where it was placed (the worker measures nothing again).
        rt = replace(runtime, placed=where[id(p)]) if runtime.device == "auto" else runtime
        return pack_task.submit(p, rt)

    if runtime.device == "auto" and "cuda" in where.values():
        yield from in_lanes(placed, submit, runtime.max_workers)
        return
    futures = {}
    for p, _ in placed:
        futures[submit(p)] = p
    yield from ((f, futures[f]) for f in as_completed(list(futures)))


def _left(pack: list[CellConfig], done: Mapping[str, CellResult]) -> list[CellConfig]:
    return [c for c in pack if c.config_hash() not in done]


@contextmanager
def _stopping(runtime: CellRuntime) -> Iterator[None]:
    """While cells simulate and train: SIGTERM and Ctrl-C raise
    :class:`~tasks.stopping.Stopped` here (re-armed inside the Prefect flow, whose engine
    replaces the SIGTERM handler), and on either the stop event is set: queued work never
    starts, running cells stop at their next batch and end KILLED, a running simulation is
    abandoned."""
    with stop_signals():
        try:
            yield
        except BaseException:
            if runtime.stop is not None:
                runtime.stop.set()
            raise


@contextmanager
def _training(runtime: CellRuntime) -> Iterator[None]:
    """While packs train: the worker processes (process isolation) and log lines printed above
    the progress bars."""
    isolated = (
        runtime.isolation == "process"
        and runtime.task_runner == "thread"
        and not worker_pool_active()
    )
    # runtime.stop reaches the worker processes through the pool's own stop event
    pool = worker_processes(runtime.max_workers, runtime.stop) if isolated else nullcontext()
    # Only loggers that print to the console: a logger without a console handler (the root,
    # usually) would get one, and print every record it receives a second time.
    printing = [
        lg
        for lg in (logging.getLogger("prefect"), logging.getLogger())
        if any(isinstance(h, logging.StreamHandler) for h in lg.handlers)
    ]
    quiet = logging_redirect_tqdm(loggers=printing) if runtime.progress and printing else None
    with pool, quiet or nullcontext():
        yield
