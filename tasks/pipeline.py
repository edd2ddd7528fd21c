"""The pure core of a cell: plain steps that return values, and the one function that logs them.

A cell's data set is simulated (:func:`simulate_data`) and split (:func:`prepare_cell`), its
model built (:func:`build_cell_model`), trained (by :func:`nltrain.train_packed`, in
:func:`tasks.cell.fit_cells`) and evaluated (:func:`evaluate_cell`). Each step's record is a
:class:`CellOutcome` (:func:`config_outcome`, :func:`data_outcome`, :func:`model_outcome`,
:func:`evaluate_cell`: params, tags, metrics, figures, the model to save, the data set), and
:func:`log_outcome` is the one place an outcome reaches the run log. A new test metric goes
into :func:`cell_metrics` (or :func:`score_metrics`) and nowhere else;
the per-epoch metrics of the live loss curve are :func:`epoch_metrics`.
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from datasets import Dataset, Prepared, data_home, load_or_simulate, prepare
from nlmodels import (
    ForecastModel,
    build_model,
    cpu_mode_in_effect,
    native_cpu_kernels,
    numerics_downgrade,
    numerics_tag,
)
from nltrain import (
    EpochRecord,
    Evaluation,
    TrainResult,
    divergence,
    evaluate,
    outlier_census,
    seeded,
)
from nltrain.numerics import last_pinned_check
from tasks.config import CellConfig, DataConfig
from tasks.config.declarations import ensure_declared
from tasks.machine import device_identity
from tasks.modelio import ModelSpec, model_params, resolved_model_args, save_model
from tasks.reports import plot_extrapolation, plot_loss_curves
from tasks.scratch import cell_scratch
from tasks.tracking import Metrics, RunTags

if TYPE_CHECKING:
    from tasks.tracking import RunLog

__all__ = [
    "CellOutcome",
    "CellSetup",
    "LoggedDataset",
    "build_cell_model",
    "cell_metrics",
    "config_outcome",
    "data_outcome",
    "epoch_metrics",
    "evaluate_cell",
    "log_outcome",
    "model_outcome",
    "prepare_cell",
    "score_metrics",
    "simulate_data",
]

_DATA_LOCKS: dict[tuple, threading.Lock] = {}
_DATA_LOCKS_GUARD = threading.Lock()


def simulate_data(
    system: str, data: DataConfig, seed: int, cache_dir: Path | None = None
) -> Dataset:
    """The cell's data set, simulated once and then read from the on-disk cache."""
    ensure_declared(system, data.source)  # a declared system, in a process new to it
    source = data.source.digest if data.source is not None else None
    noise_on = data.noise_on if data.noise_effective else "raw"  # no noise: one data set
    sizes = (data.n_trajectories, data.n_points)
    key = (system, source, *sizes, seed, data.noise_std, noise_on, cache_dir)
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
            noise_on=noise_on,
        )


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


@dataclass(frozen=True)
class LoggedDataset:
    """A data set as a run records it (an MLflow dataset input)."""

    name: str
    digest: str
    source: str
    profile: Mapping[str, object]


@dataclass(frozen=True)
class CellOutcome:
    """What one step of a cell has to record: ``params``; ``texts`` (artifact file → text);
    ``tags``; the ``dataset`` it used; ``figures`` (file name under ``plots/`` → PNG bytes);
    the ``model`` to save (the module and its :class:`~tasks.modelio.ModelSpec`); and
    ``metrics``, which :func:`log_outcome` logs last."""

    params: Mapping[str, object] = field(default_factory=dict)
    texts: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, object] = field(default_factory=dict)
    dataset: LoggedDataset | None = None
    figures: Mapping[str, bytes] = field(default_factory=dict)
    model: tuple[ForecastModel, ModelSpec] | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass
class CellSetup:
    """A cell ready to train: its data set, split, initial model and the model's fully
    resolved constructor arguments (defaults included)."""

    cell: CellConfig
    ds: Dataset
    prepared: Prepared
    model: ForecastModel
    model_args: dict[str, Any]

    @property
    def state_dim(self) -> int:
        return int(self.ds.x.shape[-1])


def build_cell_model(cell: CellConfig, state_dim: int) -> tuple[ForecastModel, dict[str, Any]]:
    """The cell's model with its initial weights (drawn from the cell's own seed) and its
    resolved constructor arguments."""
    with seeded(cell.seed):
        model = build_model(cell.method, state_dim, **cell.model)
    return model, resolved_model_args(cell.method, state_dim, cell.model)


def config_outcome(cell: CellConfig, *, device: str, profile: str) -> CellOutcome:
    """What a cell records first: its config as params (with the device asked for and the
    profile) and as ``config.json``."""
    return CellOutcome(
        params={**cell.flat_params(), "device": device, "profile": profile},
        texts={"config.json": cell.model_dump_json(indent=2)},
    )


def data_outcome(
    cell: CellConfig, ds: Dataset, prepared: Prepared, cache_dir: Path | None = None
) -> CellOutcome:
    """What a cell records of its data: the data set and split fingerprints, the >10σ outlier
    census of each split (kept, counted) and the data set itself."""
    src = cell.data.source
    # a data file is logged as itself (its path and content digest), a simulation as the cache
    origin = {} if src is None else {"source_kind": src.kind, "source_digest": src.digest}
    return CellOutcome(
        tags={RunTags.DATASET_HASH: ds.fingerprint, "split_hash": prepared.fingerprint},
        dataset=LoggedDataset(
            name=f"{cell.system}-n{ds.x.shape[0]}-seed{cell.seed}",
            digest=src.digest if src is not None and src.kind == "file" else ds.fingerprint,
            source=(src.path or src.simulator or "")
            if src is not None
            else str(cache_dir or data_home() / "cache"),
            profile={
                **origin,
                "system": cell.system,
                "n_trajectories": int(ds.x.shape[0]),
                "n_points": int(ds.x.shape[1]),
                "state_dim": int(ds.x.shape[2]),
                "noise_std": cell.data.noise_std,
                "split_fingerprint": prepared.fingerprint,
            },
        ),
        metrics=outlier_census(prepared),
    )


def model_outcome(setup: CellSetup) -> CellOutcome:
    """What a cell records of its model: its size, state dimension and fully resolved
    constructor arguments (``model.*`` params not already in the config, and
    ``model_args.json``). The config hash is not touched."""
    logged = setup.cell.flat_params()
    resolved = {k: v for k, v in model_params(setup.model_args).items() if k not in logged}
    return CellOutcome(
        params={
            "n_parameters": sum(p.numel() for p in setup.model.parameters()),
            "state_dim": setup.state_dim,
            **resolved,
        },
        texts={"model_args.json": json.dumps(setup.model_args, indent=2, sort_keys=True)},
    )


def epoch_metrics(record: EpochRecord) -> dict[str, float]:
    """The metrics of one training epoch (the live loss curve)."""
    return {
        Metrics.TRAIN_LOSS: record.train_loss,
        Metrics.VAL_LOSS: record.val_loss,
        Metrics.VAL_RMSE: record.val_rmse,
        Metrics.EPOCH_SECONDS: record.seconds,
        Metrics.NFE: record.nfe,
    }


def score_metrics(ev: Evaluation) -> dict[str, float]:
    """A cell's test scores under their metric names (per dimension too)."""
    out = {
        Metrics.TEST_RMSE: ev.test_rmse,
        Metrics.TEST_RMSE_PHYSICAL: ev.test_rmse_physical,
        Metrics.TEST_NFE: float(ev.nfe),
        Metrics.TEST_TOP_SHARE: ev.top_share,
        Metrics.TEST_RMSE_WITHOUT_TOP: ev.rmse_without_top,
    }
    for d, (v, p) in enumerate(zip(ev.rmse_per_dim, ev.rmse_physical_per_dim)):
        out[f"test_rmse_dim{d}"] = v
        out[f"test_rmse_physical_dim{d}"] = p
    return out


def cell_metrics(ev: Evaluation, result: TrainResult, diverged: bool = False) -> dict[str, float]:
    """A trained cell's final metrics: the test scores, how training went and whether the model
    diverged (``diverged`` 1.0: see :func:`nltrain.divergence`)."""
    return {
        **score_metrics(ev),
        Metrics.BEST_EPOCH: result.best_epoch,
        Metrics.BEST_VAL_RMSE: result.best_val_rmse,
        Metrics.EPOCHS_RUN: len(result.history),
        Metrics.TRAIN_SECONDS: result.seconds,
        **({} if result.cpu_seconds is None else {Metrics.TRAIN_CPU_SECONDS: result.cpu_seconds}),
        Metrics.DIVERGED: float(diverged),
    }


def evaluate_cell(
    setup: CellSetup, result: TrainResult, device: torch.device, config_hash: str
) -> CellOutcome:
    """Score a trained cell on its test split: the metrics (:func:`cell_metrics`), how it
    trained (tags), its loss-curve and extrapolation figures and its model to save."""
    cell, prepared, model = setup.cell, setup.prepared, setup.model
    ev, pred = evaluate(
        model,
        prepared.test,
        prepared.normaliser,
        device=device,
        dtype=cell.training.dtype,
        batch_size=cell.training.batch_size,
    )
    tags = _training_tags(cell, result, device)
    diverged = divergence(result.history, ev.test_rmse, prepared.test.target)
    if diverged is not None:
        tags[RunTags.DIVERGED] = diverged
    with tempfile.TemporaryDirectory(prefix="nllab-plots-") as tmp:
        folder = Path(tmp)
        paths = [
            plot_loss_curves(result.history, folder / "loss_curves.png", title=cell.key),
            plot_extrapolation(
                prepared.test,
                pred,
                prepared.normaliser,
                folder / "extrapolation.png",
                title=f"{cell.key}: test RMSE {ev.test_rmse:.4f}",
            ),
        ]
        figures = {p.name: p.read_bytes() for p in paths}
    spec = ModelSpec(
        method=cell.method,
        state_dim=setup.state_dim,
        overrides=dict(cell.model),
        dtype=cell.training.dtype,
        normaliser=prepared.normaliser.to_dict(),
        cell=cell.model_dump(mode="json"),
        config_hash=config_hash,
        dataset_fingerprint=setup.ds.fingerprint,
        test_rmse=ev.test_rmse,
        model_args=setup.model_args,
    )
    return CellOutcome(
        tags=tags,
        figures=figures,
        model=(model, spec),
        metrics=cell_metrics(ev, result, diverged is not None),
    )


def _training_tags(cell: CellConfig, result: TrainResult, device: torch.device) -> dict:
    """How a cell trained: why it stopped, where, packed with how many, which kernels, whether
    this machine computes the pinned bytes (when ``nllab doctor`` checked it), and why the CPU
    numerics are not the ones asked for (when they are not)."""
    check = last_pinned_check() if device.type == "cpu" else None
    pinned = {} if check is None else {RunTags.NUMERICS_PINNED: check.verdict}
    if device.type == "cpu" and (downgrade := numerics_downgrade()):
        pinned[RunTags.NUMERICS_DOWNGRADE] = downgrade[:5000]
    return {
        **pinned,
        "stopped": result.stopped,
        "device_used": str(device),
        RunTags.NUMERICS_DEVICE: device_identity(str(device)),
        "packed_members": result.packed_members,
        "cuda_graphs": result.graphs,
        "numerics": numerics_tag(),
        RunTags.CPU_NUMERICS: cpu_mode_in_effect(),
        # float64 CPU training of Neural Laplace, unpacked, runs the fused C kernels
        "native_cpu_kernels": cell.method == "neural_laplace"
        and cell.training.dtype == "float64"
        and device.type == "cpu"
        and result.packed_members == 1
        and native_cpu_kernels(),
    }


def log_outcome(runs: RunLog, run_id: str, outcome: CellOutcome) -> None:
    """Log ``outcome`` to run ``run_id``: params, texts, tags, data set, figures (under
    ``plots/``), model (an MLflow pyfunc logged model), and the metrics last, so that a run with
    a ``test_rmse`` has all its artifacts."""
    if outcome.params:
        runs.log_params(run_id, outcome.params)
    for name, text in outcome.texts.items():
        runs.log_text(run_id, text, name)
    if outcome.tags:
        runs.set_tags(run_id, outcome.tags)
    if (d := outcome.dataset) is not None:
        runs.log_dataset(run_id, name=d.name, digest=d.digest, source=d.source, profile=d.profile)
    if outcome.figures or outcome.model is not None:
        with cell_scratch() as tmp:  # removed at the next start should this process be killed
            folder = Path(tmp)
            if outcome.figures:
                (folder / "plots").mkdir()
                for name, data in outcome.figures.items():
                    (folder / "plots" / name).write_bytes(data)
                runs.log_artifact(run_id, folder / "plots", "plots")
            if outcome.model is not None:
                model, spec = outcome.model
                save_model(model.cpu(), spec, folder / "model")
                runs.log_model(run_id, folder / "model", "model")
    if outcome.metrics:
        runs.log_metrics(run_id, outcome.metrics)
