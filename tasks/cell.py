"""Cells end to end: data → model → train → evaluate → one MLflow child run per cell.

The orchestration around the pure core of :mod:`tasks.pipeline` (whose steps return values
and whose :func:`~tasks.pipeline.log_outcome` logs them): runs, packs, claims and reuse.
Plain functions (no Prefect), so flows, tuning and tests share them. :func:`run_pack` trains
cells whose tensors have the same shapes (cells that differ only in seed) as one packed model
(:func:`nltrain.train_packed`); each cell keeps its own child run, config hash, data split,
initial weights and result. A cell's failure is caught and returned as a
:class:`~tasks.results.CellResult` (its child run ends FAILED with the error), so one diverging
model never stops the others.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from nltrain import (
    Checkpoints,
    EpochRecord,
    LoopOptions,
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    prefers_one_by_one,
    torch_threads,
    train_packed,
)
from tasks._notify import notify_once
from tasks.config import CellConfig, Reuse, RunConfig
from tasks.config.declarations import system_info
from tasks.machine import numerics, place_pack, stored_result, stored_results
from tasks.machine.workers import worker_stop_event, worker_threads
from tasks.pipeline import (
    CellSetup,
    build_cell_model,
    config_outcome,
    data_outcome,
    epoch_metrics,
    evaluate_cell,
    log_outcome,
    model_outcome,
    prepare_cell,
    simulate_data,
)
from tasks.results import CellResult, by_config_hash
from tasks.stopping import contained
from tasks.tracking import Metrics, RunTags, TrackingSettings, attach, claim_owner, run_name

if TYPE_CHECKING:
    from tasks.tracking import CellClaims, Queries, RunLog, Store

__all__ = [
    "CLAIM_POLL_SECONDS",
    "CellRuntime",
    "ClaimLost",
    "FitOutcome",
    "fit_cells",
    "notify_once",
    "pack_key",
    "prepare_cell",
    "run_cell",
    "run_pack",
    "simulate_data",
    "stored_results",
    "torch_threads",
]


@dataclass(frozen=True)
class CellRuntime:
    """How cells run (none of it enters the config hash). Picklable except ``stop``, so it
    can travel to Dask workers (which then get ``stop=None``).

    ``pack`` trains cells that differ only in seed as one packed model; ``max_workers``,
    ``isolation`` and ``task_runner`` say how :func:`tasks.engine.run_cells` fans packs out.
    """

    tracking: TrackingSettings
    experiment_id: str
    parent_run_id: str | None
    profile: str
    device: str = "auto"
    progress: bool = False
    stop: threading.Event | None = None
    cache_dir: Path | None = None
    torch_threads: int | None = None
    pack: bool = True
    max_workers: int = 1
    isolation: Literal["process", "thread"] = "thread"
    task_runner: Literal["thread", "dask"] = "thread"
    #: which finished cells count as done (:func:`stored_results`)
    reuse: Reuse = "numerics"
    #: where :func:`tasks.engine.run_cells` placed this pack under ``device="auto"`` (``cpu`` /
    #: ``cuda``); None: the pack is placed where it runs
    placed: str | None = None
    #: where training keeps its checkpoints between epochs (None: none) and how often
    checkpoints: Path | None = None
    checkpoint_minutes: float = 5.0

    def cpu_threads(self) -> int:
        """torch's CPU threads in one worker: ``torch_threads`` when set, else this machine's
        cores shared among the workers that train at once. Never more threads than cores: a
        worker's OpenMP pool sized to the whole machine spins against the other workers' threads
        (two paper-profile packs on two cores ran several times slower so)."""
        return worker_threads(self.torch_threads, self.max_workers)

    @classmethod
    def for_store(cls, store: Store, **kw) -> CellRuntime:
        return cls(tracking=store.settings, experiment_id=store.experiment_id, **kw)

    @classmethod
    def for_config(
        cls, store: Store, config: RunConfig, parent_run_id: str | None, **kw
    ) -> CellRuntime:
        """The runtime a :class:`RunConfig` asks for (``kw`` overrides single fields)."""
        ex = config.execution
        fields = {
            "parent_run_id": parent_run_id,
            "profile": config.profile,
            "device": ex.device,
            "progress": ex.progress,
            "torch_threads": ex.torch_threads,
            "pack": ex.pack,
            "max_workers": ex.max_workers,
            "isolation": ex.isolation,
            "task_runner": ex.task_runner,
            "reuse": ex.reuse,
            # absolute: a worker process may start elsewhere
            "checkpoints": None if ex.checkpoints is None else Path(ex.checkpoints).absolute(),
            "checkpoint_minutes": ex.checkpoint_minutes,
        }
        return cls.for_store(store, **{**fields, **kw})

    # This process's handles on the store (:func:`tasks.tracking.attach`), one per need: a
    # holder of the runtime takes the collaborator it uses, never the whole set.
    def run_log(self) -> RunLog:
        """Where the cells' runs are created, logged into and ended."""
        return attach(self.tracking, self.experiment_id).runs

    def cell_claims(self) -> CellClaims:
        """Which process trains which cell."""
        return attach(self.tracking, self.experiment_id).claims

    def queries(self) -> Queries:
        """Which cells are finished (reuse)."""
        return attach(self.tracking, self.experiment_id).queries


def pack_key(cell: CellConfig) -> str:
    """Cells with the same key have tensors of the same shapes and train as one packed model:
    the same method, model settings and training protocol on data of the same shapes (state
    dimension, trajectories, time points, split); the system and seed (which change data, time
    grids, split and initial weights only) may differ."""
    payload = json.loads(cell.canonical_json())
    info, data = system_info(cell.system, cell.data), cell.data
    del payload["system"], payload["seed"]
    payload["data"] = {
        "state_dim": info.state_dim,
        "n_trajectories": data.n_trajectories or info.default_trajectories,
        "n_points": data.n_points or info.default_points,
        "fractions": list(data.fractions),
        "n_observed": data.n_observed,
        "n_train": data.n_train,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _tags(cell: CellConfig, rt: CellRuntime, config_hash: str) -> dict[str, str]:
    return {
        RunTags.KIND: "cell",
        RunTags.METHOD: cell.method,
        RunTags.SYSTEM: cell.system,
        RunTags.SEED: str(cell.seed),
        RunTags.PROFILE: rt.profile,
        RunTags.CONFIG_HASH: config_hash,
        **numerics.cell_tags(cell),
    }


@dataclass(frozen=True)
class FitOutcome:
    """A trained and evaluated cell: its test RMSE, how training went, and the metrics its run
    logged last (:func:`tasks.pipeline.cell_metrics`: ``test_top_share``,
    ``test_rmse_without_top``, ...; empty when the test was not scored)."""

    test_rmse: float
    train: TrainResult
    metrics: Mapping[str, float] = field(default_factory=dict)


def fit_cells(
    cells: Sequence[CellConfig],
    rt: CellRuntime,
    run_ids: Sequence[str],
    *,
    on_epoch: Callable[[int, EpochRecord], None] | None = None,
    evaluate_test: bool = True,
) -> list[FitOutcome | Exception]:
    """Train, evaluate and log ``cells`` (one pack) into their already created runs.

    Per cell the outcome, or the exception that ended it (its traceback is logged as
    ``error.txt``). ``on_epoch(i, record)`` is called after each epoch of cell ``i`` (e.g. to
    report to a pruner); an exception it raises propagates and ends the whole pack, as does an
    interruption. ``evaluate_test=False`` (tuning trials) never touches the test split: no test
    metrics, plots or model artifact, and ``FitOutcome.test_rmse`` is NaN.
    """
    with torch_threads(rt.cpu_threads()):
        return _fit_cells(cells, rt, run_ids, on_epoch, evaluate_test)


def _fit_cells(
    cells: Sequence[CellConfig],
    rt: CellRuntime,
    run_ids: Sequence[str],
    on_epoch: Callable[[int, EpochRecord], None] | None,
    evaluate_test: bool,
) -> list[FitOutcome | Exception]:
    pack = _Pack(cells, rt, run_ids, on_epoch)
    outcomes: dict[int, FitOutcome | Exception] = {}
    for i, (cell, run_id) in enumerate(zip(cells, run_ids, strict=True)):
        try:  # 1. set up: data, split, initial weights
            pack.setups[i] = _set_up(cell, run_id, rt, pack.runs)
        except Exception as e:
            outcomes[i] = pack.failed(i, e)
    live = list(pack.setups)
    for i, res in zip(live, pack.train(live) if live else [], strict=True):
        if isinstance(res, Exception):  # 2. trained (one by one if the pack failed)
            outcomes[i] = pack.failed(i, res)
            if isinstance(res, TrainingDiverged):  # its outcome, kept in its run
                pack.discard(i)
        else:  # 3. evaluated and logged
            outcomes[i] = pack.score(i, res, evaluate_test)
    return [outcomes[i] for i in range(len(cells))]


class _Pack:
    """The members of one :func:`fit_cells` call, where they train and how they log."""

    def __init__(self, cells, rt: CellRuntime, run_ids, on_epoch) -> None:
        self.rt, self.runs, self.on_epoch = rt, rt.run_log(), on_epoch
        self.cells, self.run_ids = list(cells), list(run_ids)
        self.setups: dict[int, CellSetup] = {}
        self.training = cells[0].training
        # The step this pack runs, as measured: where the engine placed it (on a machine that
        # has that device), else placed here the same way, from the cache.
        placed = rt.placed if rt.placed != "cuda" or torch.cuda.is_available() else None
        self.device = place_pack(list(cells), placed or rt.device, cache_dir=rt.cache_dir)
        self.stop = rt.stop if rt.stop is not None else worker_stop_event()
        self.checkpoints = None  # where the cells keep their training checkpoints, if anywhere
        if rt.checkpoints is not None:
            ids = {c.key: numerics.computation_identity(c, self.device) for c in self.cells}
            self.checkpoints = Checkpoints(rt.checkpoints, ids, rt.checkpoint_minutes * 60)
        #: what the caller's ``on_epoch`` raised: it ends the pack, never only a member
        self.raised: BaseException | None = None

    def failed(self, i: int, e: Exception) -> Exception:
        # The full traceback next to the run: the tag only holds the message.
        text = "".join(traceback.format_exception(e))
        self.runs.log_text(self.run_ids[i], text, "error.txt")
        return e

    def log_epoch(self, i: int, r: EpochRecord) -> None:
        # the one logging hook inside training: the live loss curve
        self.runs.log_metrics(self.run_ids[i], epoch_metrics(r), step=r.epoch)
        if self.on_epoch is not None:
            try:
                self.on_epoch(i, r)
            except BaseException as e:
                self.raised = e
                raise

    def train(self, idx: list[int]) -> list[TrainResult | Exception]:
        """Members ``idx`` trained as one pack; if the pack fails, each member alone (the same
        result as packed, by contract), so that one member's failure is its own. An
        interruption, or an exception from the caller's ``on_epoch``, propagates."""
        setups = [self.setups[i] for i in idx]
        try:
            return list(
                train_packed(
                    [s.model for s in setups],
                    [s.prepared.train for s in setups],
                    [s.prepared.val for s in setups],
                    self.training,
                    device=self.device,
                    seeds=[s.cell.seed for s in setups],
                    options=LoopOptions(
                        labels=tuple(s.cell.key for s in setups),
                        on_epoch=lambda j, r: self.log_epoch(idx[j], r),
                        on_resume=lambda j, epoch: self.runs.set_tags(
                            self.run_ids[idx[j]], {RunTags.RESUMED_AT_EPOCH: epoch}
                        ),
                        stop=self.stop,
                        progress=self.rt.progress,
                        checkpoints=self.checkpoints,
                    ),
                    # one by one where packing is slower (as planned and probed)
                    pack=not prefers_one_by_one(setups[0].model, self.device),
                )
            )
        except Exception as e:
            if isinstance(e, TrainingInterrupted) or e is self.raised:
                raise
            if len(idx) == 1:
                return [e]
        return [r for i in idx for r in self.train([i])]

    def discard(self, i: int) -> None:
        """Member ``i``'s checkpoints removed: its training's outcome is in its run."""
        if self.checkpoints is not None:
            self.checkpoints.discard([self.cells[i].key])

    def score(self, i: int, res: TrainResult, evaluate_test: bool) -> FitOutcome | Exception:
        """Member ``i`` evaluated on its test split and logged, or the error that stopped it."""
        if not evaluate_test:
            self.discard(i)
            return FitOutcome(math.nan, res)
        try:
            evaluated = evaluate_cell(self.setups[i], res, self.device, self.cells[i].config_hash())
            log_outcome(self.runs, self.run_ids[i], evaluated)
        except Exception as e:
            return self.failed(i, e)  # its checkpoint kept: a rerun scores it again at once
        self.discard(i)
        metrics = dict(evaluated.metrics)
        return FitOutcome(metrics[Metrics.TEST_RMSE], res, metrics)


def _set_up(cell: CellConfig, run_id: str, rt: CellRuntime, runs: RunLog) -> CellSetup:
    """Data, split and initial weights of one member (weights from its own seed), each step's
    record logged as soon as it is made (a cell that fails later still shows them)."""
    log_outcome(runs, run_id, config_outcome(cell, device=rt.device, profile=rt.profile))
    ds = simulate_data(cell.system, cell.data, cell.seed, rt.cache_dir)
    prepared = prepare_cell(cell, ds)
    log_outcome(runs, run_id, data_outcome(cell, ds, prepared, rt.cache_dir))
    model, model_args = build_cell_model(cell, int(ds.x.shape[-1]))
    setup = CellSetup(cell, ds, prepared, model, model_args)
    log_outcome(runs, run_id, model_outcome(setup))
    return setup


#: Seconds between checks while another process trains a cell this one also needs.
CLAIM_POLL_SECONDS = 2.0


def run_pack(cells: Sequence[CellConfig], rt: CellRuntime) -> list[CellResult]:
    """Train and evaluate ``cells`` (one pack: see :func:`pack_key`) in their own MLflow child
    runs; never raises on cell errors. Results in input order.

    Each cell is claimed in the store first (:meth:`tasks.tracking.CellClaims.cell_claim`), so two
    processes on one store never train the same cell: a cell claimed elsewhere is awaited and
    reused when it finishes, or taken over when its claim goes stale. A process that lost its
    claim while it trained (suspended past the stale time, its cell taken over) does not log the
    cell FINISHED: its run ends KILLED and it awaits the new holder's result. A failed member's
    run ends FAILED with its error; the others finish. Ctrl-C (``KeyboardInterrupt``) still
    propagates, after ending every open run as KILLED.
    """
    claims, queries = rt.cell_claims(), rt.queries()
    owner = claim_owner()
    results: dict[str, CellResult] = {}
    elsewhere: list[CellConfig] = []
    with ExitStack() as held:
        mine = []
        for c in cells:
            h = c.config_hash()
            if not held.enter_context(claims.cell_claim(h, owner)):
                elsewhere.append(c)
            elif (done := stored_result(queries, c, rt.reuse)) is not None:
                results[h] = done  # finished meanwhile
            else:
                mine.append(c)
        if mine:
            lost: list[CellConfig] = []
            results.update(by_config_hash(_train_pack(mine, rt, owner, lost)))
            elsewhere += lost
    for c in elsewhere:
        results[c.config_hash()] = _await_cell(c, rt)
    return [results[c.config_hash()] for c in cells]


def _await_cell(cell: CellConfig, rt: CellRuntime) -> CellResult:
    """The result of a cell another process has claimed: reused once it finishes there, trained
    here if its claim is released or goes stale first. Says once whom it waits for."""
    claims, queries, h = rt.cell_claims(), rt.queries(), cell.config_hash()
    stop = rt.stop if rt.stop is not None else worker_stop_event()
    while True:
        if (done := stored_result(queries, cell, rt.reuse)) is not None:
            return done
        if stop is not None and stop.is_set():
            return CellResult.failed(
                cell, "interrupted", "interrupted while another process trained it"
            )
        owner = claim_owner()
        with claims.cell_claim(h, owner) as mine:
            if mine:
                # finished meanwhile
                if (done := stored_result(queries, cell, rt.reuse)) is not None:
                    return done
                lost: list[CellConfig] = []
                (result,) = _train_pack([cell], rt, owner, lost)
                if not lost:
                    return result
            elif (holder := claims.claim_holder(h)) is not None:
                notify_once(
                    f"waiting:{h}:{holder}",
                    f"waiting for cell {cell.key} ({h[:12]}), held by {holder}",
                )
        time.sleep(CLAIM_POLL_SECONDS)


def _train_pack(
    cells: Sequence[CellConfig],
    rt: CellRuntime,
    owner: str | None = None,
    lost: list[CellConfig] | None = None,
) -> list[CellResult]:
    """:func:`run_pack` for cells this process holds the claims of (as ``owner``, if given).

    With ``owner``, each cell's claim is checked (:meth:`~tasks.tracking.CellClaims.holds_cell`,
    the fence) before its run is ended FINISHED; a cell whose claim was lost meanwhile ends
    KILLED instead, is appended to ``lost`` and comes back ``interrupted``.
    """
    runs, claims = rt.run_log(), rt.cell_claims()
    hashes = [c.config_hash() for c in cells]
    tokens = [None if owner is None else claims.claim_generation(h, owner) for h in hashes]
    try:
        with ExitStack() as opened:
            run_ids = [
                opened.enter_context(runs.run(run_name(c), _tags(c, rt, h), rt.parent_run_id))
                for c, h in zip(cells, hashes, strict=True)
            ]
            with contained():  # a plugin model's sys.exit fails its cells, not the command
                outcomes = fit_cells(cells, rt, run_ids)
            members = zip(cells, hashes, run_ids, outcomes, tokens, strict=True)
            return [_close_member(m, rt, owner, lost) for m in members]
    except Exception as e:  # every open run has ended with it; Ctrl-C propagates
        stopped = isinstance(e, TrainingInterrupted)
        return [_unfinished(c, "interrupted" if stopped else "failed", e) for c in cells]


def _close_member(
    member: tuple, rt: CellRuntime, owner: str | None, lost: list | None
) -> CellResult:
    """The result of ``(cell, hash, run id, outcome, claim generation)``; its run ends here
    unless it ends FINISHED (as its :meth:`~tasks.tracking.RunLog.run` block completes)."""
    (c, h, r, out, token), runs, claims = member, rt.run_log(), rt.cell_claims()
    if not isinstance(out, FitOutcome):  # this member diverged; the others went on
        runs.end_with_error(r, out)
        return _unfinished(c, "failed", out)
    if owner is not None and not claims.holds_cell(h, owner, token):
        # Fenced: another process took the cell over (this one was stopped past the stale
        # time); its run is the cell's one FINISHED run, this one must not be another.
        holder = claims.claim_holder(h) or "another process (since released)"
        lost_claim = ClaimLost(
            f"this process lost its claim on cell {c.key} while training it (stopped "
            f"longer than the claim's stale time); {holder} took it over, so this run "
            "is not logged as FINISHED"
        )
        runs.end_with_error(r, lost_claim, killed=True)
        notify_once(f"lost:{r}", str(lost_claim))
        if lost is not None:
            lost.append(c)
        return _unfinished(c, "interrupted", lost_claim)
    return CellResult.fresh(c, r, out.metrics)


class ClaimLost(RuntimeError):
    """A cell's claim was taken over while this process trained it; its run ends KILLED."""


def _unfinished(
    cell: CellConfig, status: Literal["failed", "interrupted"], error: Exception
) -> CellResult:
    message = str(error) if status == "interrupted" else f"{type(error).__name__}: {error}"
    return CellResult.failed(cell, status, message)


def run_cell(cell: CellConfig, rt: CellRuntime) -> CellResult:
    """Train and evaluate one cell in a new child run, whether or not it already has one
    (:func:`run_pack` is the engine's path, which reuses and claims)."""
    return _train_pack([cell], replace(rt, pack=False))[0]
