"""One benchmark cell end to end: data → model → train → evaluate → MLflow child run.

Plain functions (no Prefect), so flows and tests share them. A cell's failure is caught and
returned as a :class:`~tasks.reporting.CellResult` (its child run ends FAILED with the error), so
one diverging model never stops the others.
"""

from __future__ import annotations

import tempfile
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from datasets import Dataset, Prepared, data_home, load_or_simulate, prepare
from nlmodels import build_model, native_cpu_kernels
from tasks._workers import worker_stop_event
from tasks.config import CellConfig, DataConfig
from tasks.evaluation import evaluate, outlier_census, plot_extrapolation, plot_loss_curves
from tasks.modelio import ModelSpec, save_model
from tasks.reporting import CellResult
from tasks.tracking import Tracker, TrackingSettings
from tasks.training import EpochRecord, TrainingInterrupted, seeded, select_device, train

__all__ = ["CellRuntime", "prepare_cell", "run_cell", "simulate_data"]

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
    """How a cell runs (none of it enters the config hash). Picklable except ``stop``, so it
    can travel to Dask workers (which then get ``stop=None``)."""

    tracking: TrackingSettings
    experiment_id: str
    parent_run_id: str | None
    profile: str
    device: str = "auto"
    progress: bool = False
    stop: threading.Event | None = None
    cache_dir: Path | None = None
    torch_threads: int | None = None

    @classmethod
    def for_tracker(cls, tracker: Tracker, **kw) -> CellRuntime:
        return cls(tracking=tracker.settings, experiment_id=tracker.experiment_id, **kw)

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


def _tags(cell: CellConfig, rt: CellRuntime, config_hash: str) -> dict[str, str]:
    return {
        "nllab.kind": "cell",
        "method": cell.method,
        "system": cell.system,
        "seed": str(cell.seed),
        "profile": rt.profile,
        "config_hash": config_hash,
    }


def run_cell(cell: CellConfig, rt: CellRuntime) -> CellResult:
    """Train and evaluate one cell inside its own MLflow child run; never raises on cell errors.

    Ctrl-C (``KeyboardInterrupt``) still propagates, after ending the run as KILLED.
    """
    h = cell.config_hash()
    try:
        with rt.tracker.run(cell.key, _tags(cell, rt, h), rt.parent_run_id) as run_id:
            test_rmse = _train_and_log(cell, rt, run_id, h)
    except TrainingInterrupted as e:
        return CellResult(
            cell.system, cell.method, cell.seed, "interrupted", config_hash=h, error=str(e)
        )
    except Exception as e:
        return CellResult(
            cell.system,
            cell.method,
            cell.seed,
            "failed",
            config_hash=h,
            error=f"{type(e).__name__}: {e}",
        )
    return CellResult(cell.system, cell.method, cell.seed, "finished", test_rmse, run_id, h)


def _train_and_log(cell: CellConfig, rt: CellRuntime, run_id: str, config_hash: str) -> float:
    tracker = rt.tracker
    tracker.log_params(run_id, {**cell.flat_params(), "device": rt.device, "profile": rt.profile})
    tracker.log_text(run_id, cell.model_dump_json(indent=2), "config.json")
    try:
        _fit(cell, rt, run_id, config_hash)
    except Exception:
        # The full traceback next to the run: the tag only holds the message.
        tracker.log_text(run_id, traceback.format_exc(), "error.txt")
        raise
    return float(tracker.get_run_data(run_id).data.metrics["test_rmse"])


def _fit(cell: CellConfig, rt: CellRuntime, run_id: str, config_hash: str) -> None:
    tracker = rt.tracker
    if rt.torch_threads is not None and torch.get_num_threads() != rt.torch_threads:
        torch.set_num_threads(rt.torch_threads)
    device = select_device(rt.device)
    ds = simulate_data(cell.system, cell.data, cell.seed, rt.cache_dir)
    prepared = prepare_cell(cell, ds)
    tracker.log_metrics(run_id, outlier_census(prepared))  # >10σ values per split: kept, counted
    tracker.set_tags(
        run_id,
        {
            "dataset_hash": ds.fingerprint,
            "split_hash": prepared.fingerprint,
            "device_used": str(device),
            # float64 CPU training of Neural Laplace runs the fused C kernels when they built
            "native_cpu_kernels": cell.method == "neural_laplace"
            and cell.training.dtype == "float64"
            and device.type == "cpu"
            and native_cpu_kernels(),
        },
    )
    tracker.log_dataset(
        run_id,
        name=f"{cell.system}-n{ds.x.shape[0]}-seed{cell.seed}",
        digest=ds.fingerprint,
        source=str(rt.cache_dir or data_home() / "cache"),
        profile={
            "system": cell.system,
            "n_trajectories": int(ds.x.shape[0]),
            "n_points": int(ds.x.shape[1]),
            "state_dim": int(ds.x.shape[2]),
            "noise_std": cell.data.noise_std,
            "split_fingerprint": prepared.fingerprint,
        },
    )
    state_dim = int(ds.x.shape[-1])
    with seeded(cell.seed):
        model = build_model(cell.method, state_dim, **cell.model)
    n_params = sum(p.numel() for p in model.parameters())
    tracker.log_params(run_id, {"n_parameters": n_params, "state_dim": state_dim})

    def log_epoch(r: EpochRecord) -> None:
        tracker.log_metrics(
            run_id,
            {
                "train_loss": r.train_loss,
                "val_loss": r.val_loss,
                "val_rmse": r.val_rmse,
                "epoch_seconds": r.seconds,
                "nfe": r.nfe,
            },
            step=r.epoch,
        )

    result = train(
        model,
        prepared.train,
        prepared.val,
        cell.training,
        device=device,
        seed=cell.seed,
        on_epoch=log_epoch,
        stop=rt.stop if rt.stop is not None else worker_stop_event(),
        progress=rt.progress,
        label=cell.key,
    )
    ev, pred = evaluate(
        model,
        prepared.test,
        prepared.normaliser,
        device=device,
        dtype=cell.training.dtype,
        batch_size=cell.training.batch_size,
    )
    tracker.set_tags(run_id, {"stopped": result.stopped})
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
            state_dim=state_dim,
            overrides=dict(cell.model),
            dtype=cell.training.dtype,
            normaliser=prepared.normaliser.to_dict(),
            cell=cell.model_dump(mode="json"),
            config_hash=config_hash,
            dataset_fingerprint=ds.fingerprint,
            test_rmse=ev.test_rmse,
        )
        save_model(model.cpu(), spec, folder / "model")
        tracker.log_artifact(run_id, folder / "plots", "plots")
        tracker.log_artifact(run_id, folder / "model", "model")
    # Logged last: a run with test_rmse has all its artifacts.
    tracker.log_metrics(
        run_id,
        {
            **ev.metrics(),
            "best_epoch": result.best_epoch,
            "best_val_rmse": result.best_val_rmse,
            "epochs_run": len(result.history),
            "train_seconds": result.seconds,
        },
    )
