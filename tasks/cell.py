"""Cells end to end: data → model → train → evaluate → one MLflow child run per cell.

Plain functions (no Prefect), so flows, tuning and tests share them. :func:`run_pack` trains
cells whose tensors have the same shapes (cells that differ only in seed) as one packed model
(:func:`tasks.packing.train_packed`); each cell keeps its own child run, config hash, data split,
initial weights and result. A cell's failure is caught and returned as a
:class:`~tasks.reporting.CellResult` (its child run ends FAILED with the error), so one diverging
model never stops the others.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from datasets import SYSTEMS, Dataset, Prepared, data_home, load_or_simulate, prepare
from nlmodels import ForecastModel, build_model, native_cpu_kernels
from tasks._workers import worker_stop_event
from tasks.config import CellConfig, DataConfig, RunConfig
from tasks.evaluation import evaluate, outlier_census, plot_extrapolation, plot_loss_curves
from tasks.modelio import ModelSpec, model_params, resolved_model_args, save_model
from tasks.packing import prefers_one_by_one, train_packed
from tasks.placement import place_pack
from tasks.reporting import CellResult, stored_result
from tasks.tracking import RunRecord, Tracker, TrackingSettings, claim_owner, run_name
from tasks.training import (
    EpochRecord,
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    seeded,
)

__all__ = [
    "CellRuntime",
    "ClaimLost",
    "FitOutcome",
    "fit_cells",
    "pack_key",
    "prepare_cell",
    "run_cell",
    "run_pack",
    "simulate_data",
]

_DATA_LOCKS: dict[tuple, threading.Lock] = {}
_DATA_LOCKS_GUARD = threading.Lock()


def simulate_data(
    system: str, data: DataConfig, seed: int, cache_dir: Path | None = None
) -> Dataset:
    """The cell's data set, simulated once and then read from the on-disk cache."""
    key = (system, data.n_trajectories, data.n_points, seed, data.noise_std, cache_dir)
    with _DATA_LOCKS_GUARD:
        lock = _DATA_LOCKS.setdefault(key, threading.Lock())
    # Cells sharing a data set wait for one simulation instead of each running their own.
    with lock:
        return load_or_simulate(
            system,
            n_trajectories=data.n_trajectories,
            n_points=data.n_points,
            seed=seed,
            noise_std=data.noise_std,
            cache_dir=cache_dir,
        )


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
    #: where :func:`tasks.engine.run_cells` placed this pack under ``device="auto"`` (``cpu`` /
    #: ``cuda``); None: the pack is placed where it runs
    placed: str | None = None

    @classmethod
    def for_tracker(cls, tracker: Tracker, **kw) -> CellRuntime:
        return cls(tracking=tracker.settings, experiment_id=tracker.experiment_id, **kw)

    @classmethod
    def for_config(
        cls, tracker: Tracker, config: RunConfig, parent_run_id: str | None, **kw
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
        }
        return cls.for_tracker(tracker, **{**fields, **kw})

    @property
    def tracker(self) -> Tracker:
        return Tracker.attach(self.tracking, self.experiment_id)


def prepare_cell(cell: CellConfig, ds: Dataset) -> Prepared:
    """The cell's split, observed/predicted halves and normalisation of its data set ``ds``."""
    return prepare(
        ds,
        seed=cell.seed,
        fractions=cell.data.fractions,
        n_observed=cell.data.n_observed,
        n_train=cell.data.n_train,
        normalise_on=cell.data.normalise_on,
    )


def pack_key(cell: CellConfig) -> str:
    """Cells with the same key have tensors of the same shapes and train as one packed model:
    the same method, model settings and training protocol on data of the same shapes (state
    dimension, trajectories, time points, split); the system and seed (which change data, time
    grids, split and initial weights only) may differ."""
    payload = json.loads(cell.canonical_json())
    info, data = SYSTEMS[cell.system], cell.data
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
        "nllab.kind": "cell",
        "method": cell.method,
        "system": cell.system,
        "seed": str(cell.seed),
        "profile": rt.profile,
        "config_hash": config_hash,
    }


@dataclass(frozen=True)
class FitOutcome:
    """A trained and evaluated cell: its test RMSE, how training went, and the test metrics
    (``test_top_share``, ``test_rmse_without_top``, ...; empty when the test was not scored)."""

    test_rmse: float
    train: TrainResult
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass
class _Member:
    """One cell of a pack while it is set up, trained and evaluated."""

    cell: CellConfig
    run_id: str
    config_hash: str
    ds: Dataset | None = None
    prepared: Prepared | None = None
    model: ForecastModel | None = None
    model_args: dict[str, Any] | None = None


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
    if rt.torch_threads is not None and torch.get_num_threads() != rt.torch_threads:
        torch.set_num_threads(rt.torch_threads)
    tracker = rt.tracker
    members = [_Member(c, r, c.config_hash()) for c, r in zip(cells, run_ids, strict=True)]
    outcomes: list[FitOutcome | Exception | None] = [None] * len(members)

    def fail(i: int, e: Exception) -> None:
        outcomes[i] = e
        # The full traceback next to the run: the tag only holds the message.
        tracker.log_text(members[i].run_id, "".join(traceback.format_exception(e)), "error.txt")

    # The step this pack runs, as measured: where the engine placed it (on a machine that has
    # that device), else placed here the same way, from the cache.
    placed = rt.placed if rt.placed != "cuda" or torch.cuda.is_available() else None
    device = place_pack(list(cells), placed or rt.device, cache_dir=rt.cache_dir)
    for i, m in enumerate(members):
        try:
            _set_up(m, rt, device)
        except Exception as e:
            fail(i, e)
    live = [i for i, m in enumerate(members) if outcomes[i] is None]
    if not live:
        return outcomes  # type: ignore[return-value]

    def log_epoch(i: int, r: EpochRecord) -> None:
        tracker.log_metrics(
            members[i].run_id,
            {
                "train_loss": r.train_loss,
                "val_loss": r.val_loss,
                "val_rmse": r.val_rmse,
                "epoch_seconds": r.seconds,
                "nfe": r.nfe,
            },
            step=r.epoch,
        )
        if on_epoch is not None:
            try:
                on_epoch(i, r)
            except Exception as e:
                raise _CallbackError from e

    stop = rt.stop if rt.stop is not None else worker_stop_event()

    def train_members(idx: list[int]) -> list[TrainResult | TrainingDiverged]:
        return train_packed(
            [members[i].model for i in idx],
            [members[i].prepared.train for i in idx],
            [members[i].prepared.val for i in idx],
            cells[0].training,
            device=device,
            seeds=[members[i].cell.seed for i in idx],
            labels=[members[i].cell.key for i in idx],
            on_epoch=lambda j, r: log_epoch(idx[j], r),
            stop=stop,
            progress=rt.progress,
            # as the engine plans and the probe measures: one by one where packing is slower
            pack=not prefers_one_by_one(members[idx[0]].model, device),
        )

    try:
        results: list[TrainResult | Exception] = list(train_members(live))
    except _CallbackError as e:
        raise e.__cause__ from None
    except (TrainingInterrupted, KeyboardInterrupt):
        raise
    except Exception as e:
        if len(live) == 1:
            fail(live[0], e)
            return outcomes  # type: ignore[return-value]
        # Isolate the failure: each member alone (the same result as packed, by contract).
        results = []
        for i in live:
            try:
                results.extend(train_members([i]))
            except _CallbackError as e2:
                raise e2.__cause__ from None
            except (TrainingInterrupted, KeyboardInterrupt):
                raise
            except Exception as e2:
                results.append(e2)
    for i, res in zip(live, results, strict=True):
        if isinstance(res, Exception):
            fail(i, res)
            continue
        try:
            if evaluate_test:
                metrics = _evaluate_and_log(members[i], rt, device, res)
                outcomes[i] = FitOutcome(metrics["test_rmse"], res, metrics)
            else:
                outcomes[i] = FitOutcome(math.nan, res)
        except Exception as e:
            fail(i, e)
    return outcomes  # type: ignore[return-value]


class _CallbackError(Exception):
    """Carries an exception raised by a caller's ``on_epoch`` through the pack's failure
    isolation (as ``__cause__``), so that it propagates instead of failing a member."""


def _set_up(m: _Member, rt: CellRuntime, device: torch.device) -> None:
    """Params, data, split and initial weights of one member (weights from its own seed)."""
    tracker, cell = rt.tracker, m.cell
    tracker.log_params(m.run_id, {**cell.flat_params(), "device": rt.device, "profile": rt.profile})
    tracker.log_text(m.run_id, cell.model_dump_json(indent=2), "config.json")
    m.ds = simulate_data(cell.system, cell.data, cell.seed, rt.cache_dir)
    m.prepared = prepare_cell(cell, m.ds)
    # >10σ values per split and dimension: kept, counted
    tracker.log_metrics(m.run_id, outlier_census(m.prepared))
    tracker.set_tags(
        m.run_id, {"dataset_hash": m.ds.fingerprint, "split_hash": m.prepared.fingerprint}
    )
    tracker.log_dataset(
        m.run_id,
        name=f"{cell.system}-n{m.ds.x.shape[0]}-seed{cell.seed}",
        digest=m.ds.fingerprint,
        source=str(rt.cache_dir or data_home() / "cache"),
        profile={
            "system": cell.system,
            "n_trajectories": int(m.ds.x.shape[0]),
            "n_points": int(m.ds.x.shape[1]),
            "state_dim": int(m.ds.x.shape[2]),
            "noise_std": cell.data.noise_std,
            "split_fingerprint": m.prepared.fingerprint,
        },
    )
    state_dim = int(m.ds.x.shape[-1])
    with seeded(cell.seed):
        m.model = build_model(cell.method, state_dim, **cell.model)
    n_params = sum(p.numel() for p in m.model.parameters())
    tracker.log_params(m.run_id, {"n_parameters": n_params, "state_dim": state_dim})
    m.model_args = log_model_args(tracker, m.run_id, cell, state_dim)


def log_model_args(
    tracker: Tracker, run_id: str, cell: CellConfig, state_dim: int
) -> dict[str, Any]:
    """Log the model's fully resolved constructor arguments (defaults included) as ``model.*``
    params and ``model_args.json``; returns them. The config hash is not touched."""
    args = resolved_model_args(cell.method, state_dim, cell.model)
    logged = cell.flat_params()
    tracker.log_params(run_id, {k: v for k, v in model_params(args).items() if k not in logged})
    tracker.log_text(run_id, json.dumps(args, indent=2, sort_keys=True), "model_args.json")
    return args


def _evaluate_and_log(
    m: _Member, rt: CellRuntime, device: torch.device, result: TrainResult
) -> dict[str, float]:
    tracker, cell, prepared, model = rt.tracker, m.cell, m.prepared, m.model
    assert prepared is not None and model is not None and m.ds is not None
    ev, pred = evaluate(
        model,
        prepared.test,
        prepared.normaliser,
        device=device,
        dtype=cell.training.dtype,
        batch_size=cell.training.batch_size,
    )
    tracker.set_tags(
        m.run_id,
        {
            "stopped": result.stopped,
            "device_used": str(device),
            "packed_members": result.packed_members,
            "cuda_graphs": result.graphs,
            # float64 CPU training of Neural Laplace, unpacked, runs the fused C kernels
            "native_cpu_kernels": cell.method == "neural_laplace"
            and cell.training.dtype == "float64"
            and device.type == "cpu"
            and result.packed_members == 1
            and native_cpu_kernels(),
        },
    )
    with tempfile.TemporaryDirectory(prefix="nllab-cell-") as tmp:
        folder = Path(tmp)
        plot_loss_curves(result.history, folder / "plots" / "loss_curves.png", title=cell.key)
        plot_extrapolation(
            prepared.test,
            pred,
            prepared.normaliser,
            folder / "plots" / "extrapolation.png",
            title=f"{cell.key}: test RMSE {ev.test_rmse:.4f}",
        )
        spec = ModelSpec(
            method=cell.method,
            state_dim=int(m.ds.x.shape[-1]),
            overrides=dict(cell.model),
            dtype=cell.training.dtype,
            normaliser=prepared.normaliser.to_dict(),
            cell=cell.model_dump(mode="json"),
            config_hash=m.config_hash,
            dataset_fingerprint=m.ds.fingerprint,
            test_rmse=ev.test_rmse,
            model_args=m.model_args,
        )
        save_model(model.cpu(), spec, folder / "model")
        tracker.log_artifact(m.run_id, folder / "plots", "plots")
        tracker.log_model(m.run_id, folder / "model", "model")  # an MLflow pyfunc model
    # Logged last: a run with test_rmse has all its artifacts.
    metrics = ev.metrics()
    tracker.log_metrics(
        m.run_id,
        {
            **metrics,
            "best_epoch": result.best_epoch,
            "best_val_rmse": result.best_val_rmse,
            "epochs_run": len(result.history),
            "train_seconds": result.seconds,
        },
    )
    return metrics


#: Seconds between checks while another process trains a cell this one also needs.
CLAIM_POLL_SECONDS = 2.0

_TOLD: set[str] = set()
_TOLD_LOCK = threading.Lock()


def notify_once(key: str, message: str) -> None:
    """Tell the user ``message`` once per ``key`` in this process: on the flow's log inside a
    Prefect run, else on stderr (worker processes share the terminal)."""
    with _TOLD_LOCK:
        if key in _TOLD:
            return
        _TOLD.add(key)
    try:
        from prefect import get_run_logger

        get_run_logger().warning(message)
    except Exception:  # no Prefect run here (a worker process, a plain call)
        print(f"nllab: {message}", file=sys.stderr, flush=True)


def reusable_run(tracker: Tracker, cell: CellConfig) -> RunRecord | None:
    """The cell's finished run if its model is present and loads; else ``None`` (and, when a
    finished run's model is unusable, the user is told once why the cell is trained again)."""
    h = cell.config_hash()
    found, broken = tracker.reusable_cells([h])
    if h in broken:
        tell_unusable(cell, *broken[h])
    return found.get(h)


def tell_unusable(cell: CellConfig, record: RunRecord, problem: str) -> None:
    """Tell the user once why ``cell``'s finished run ``record`` is not reused."""
    notify_once(
        f"unusable:{record.run_id}",
        f"cell {cell.key}: not reusing its finished run {record.run_id}: {problem}; "
        "training it again",
    )


def run_pack(cells: Sequence[CellConfig], rt: CellRuntime) -> list[CellResult]:
    """Train and evaluate ``cells`` (one pack: see :func:`pack_key`) in their own MLflow child
    runs; never raises on cell errors. Results in input order.

    Each cell is claimed in the store first (:meth:`tasks.tracking.Tracker.cell_claim`), so two
    processes on one store never train the same cell: a cell claimed elsewhere is awaited and
    reused when it finishes, or taken over when its claim goes stale. A process that lost its
    claim while it trained (suspended past the stale time, its cell taken over) does not log the
    cell FINISHED: its run ends KILLED and it awaits the new holder's result. A failed member's
    run ends FAILED with its error; the others finish. Ctrl-C (``KeyboardInterrupt``) still
    propagates, after ending every open run as KILLED.
    """
    tracker = rt.tracker
    owner = claim_owner()
    results: dict[str, CellResult] = {}
    elsewhere: list[CellConfig] = []
    with ExitStack() as claims:
        mine = []
        for c in cells:
            h = c.config_hash()
            if not claims.enter_context(tracker.cell_claim(h, owner)):
                elsewhere.append(c)
            elif (done := reusable_run(tracker, c)) is not None:
                results[h] = stored_result(c.system, c.method, c.seed, done)  # finished meanwhile
            else:
                mine.append(c)
        if mine:
            lost: list[CellConfig] = []
            results.update((r.config_hash, r) for r in _train_pack(mine, rt, owner, lost))
            elsewhere += lost
    for c in elsewhere:
        results[c.config_hash()] = _await_cell(c, rt)
    return [results[c.config_hash()] for c in cells]


def _await_cell(cell: CellConfig, rt: CellRuntime) -> CellResult:
    """The result of a cell another process has claimed: reused once it finishes there, trained
    here if its claim is released or goes stale first. Says once whom it waits for."""
    tracker, h = rt.tracker, cell.config_hash()
    stop = rt.stop if rt.stop is not None else worker_stop_event()
    while True:
        if (done := reusable_run(tracker, cell)) is not None:
            return stored_result(cell.system, cell.method, cell.seed, done)
        if stop is not None and stop.is_set():
            return CellResult(
                cell.system,
                cell.method,
                cell.seed,
                "interrupted",
                config_hash=h,
                error="interrupted while another process trained it",
            )
        owner = claim_owner()
        with tracker.cell_claim(h, owner) as mine:
            if mine:
                if (done := reusable_run(tracker, cell)) is not None:
                    return stored_result(cell.system, cell.method, cell.seed, done)
                lost: list[CellConfig] = []
                (result,) = _train_pack([cell], rt, owner, lost)
                if not lost:
                    return result
            elif (holder := tracker.claim_holder(h)) is not None:
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

    With ``owner``, each cell's claim is checked (:meth:`~tasks.tracking.Tracker.holds_cell`,
    the fence) before its run is ended FINISHED; a cell whose claim was lost meanwhile ends
    KILLED instead, is appended to ``lost`` and comes back ``interrupted``.
    """
    tracker = rt.tracker
    hashes = [c.config_hash() for c in cells]
    tokens = [None if owner is None else tracker.claim_generation(h, owner) for h in hashes]
    run_ids: list[str] = []
    try:
        for c, h in zip(cells, hashes, strict=True):
            run_ids.append(tracker.create_run(run_name(c), _tags(c, rt, h), rt.parent_run_id))
        outcomes = fit_cells(cells, rt, run_ids)
    except BaseException as e:
        for r in run_ids:
            tracker.end_with_error(r, e)
        if not isinstance(e, Exception):
            raise
        status: Literal["failed", "interrupted"] = (
            "interrupted" if isinstance(e, TrainingInterrupted) else "failed"
        )
        return [_unfinished(c, h, status, e) for c, h in zip(cells, hashes, strict=True)]
    results = []
    for c, h, r, out, token in zip(cells, hashes, run_ids, outcomes, tokens, strict=True):
        if not isinstance(out, FitOutcome):  # this member diverged; the others went on
            tracker.end_with_error(r, out)
            results.append(_unfinished(c, h, "failed", out))
            continue
        if owner is not None and not tracker.holds_cell(h, owner, token):
            # Fenced: another process took the cell over (this one was stopped past the stale
            # time); its run is the cell's one FINISHED run, this one must not be another.
            holder = tracker.claim_holder(h) or "another process (since released)"
            lost_claim = ClaimLost(
                f"this process lost its claim on cell {c.key} while training it (stopped "
                f"longer than the claim's stale time); {holder} took it over, so this run "
                "is not logged as FINISHED"
            )
            tracker.set_tags(r, {"error": f"ClaimLost: {lost_claim}"})
            tracker.end_run(r, "KILLED")
            notify_once(f"lost:{r}", str(lost_claim))
            if lost is not None:
                lost.append(c)
            results.append(_unfinished(c, h, "interrupted", lost_claim))
            continue
        tracker.end_run(r, "FINISHED")
        results.append(
            CellResult(
                c.system,
                c.method,
                c.seed,
                "finished",
                out.test_rmse,
                r,
                h,
                top_share=out.metrics.get("test_top_share"),
                rmse_without_top=out.metrics.get("test_rmse_without_top"),
            )
        )
    return results


class ClaimLost(RuntimeError):
    """A cell's claim was taken over while this process trained it; its run ends KILLED."""


def _unfinished(
    cell: CellConfig,
    config_hash: str,
    status: Literal["failed", "interrupted"],
    error: Exception,
) -> CellResult:
    message = str(error) if status == "interrupted" else f"{type(error).__name__}: {error}"
    return CellResult(
        cell.system, cell.method, cell.seed, status, config_hash=config_hash, error=message
    )


def run_cell(cell: CellConfig, rt: CellRuntime) -> CellResult:
    """Train and evaluate one cell in a new child run, whether or not it already has one
    (:func:`run_pack` is the engine's path, which reuses and claims)."""
    return _train_pack([cell], replace(rt, pack=False))[0]
