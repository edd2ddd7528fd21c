"""``nllab reproduce MODEL_URI [--ablation NAME]``: re-check a registered model, then ablate it.

1. Resolve ``models:/NAME@ALIAS`` (or ``models:/NAME/VERSION``, an MLflow 3 logged model
   ``models:/m-<id>``, a run's ``runs:/<id>/model``) to its model and source run.
2. Read the run's recorded cell config and data set hash; rebuild the same data (an error if its
   fingerprint no longer matches: the simulator changed) and the same split.
3. Re-evaluate the registered weights on the test split: the test RMSE must equal the logged one
   to ``1e-9`` (else :class:`ReproductionMismatch`).
4. Optionally re-run one ablation from that config (cells as in the benchmark) as runs nested
   under a ``reproduce`` run, which is itself nested under the source run and tagged with it.

Only reads the model registry: no model version is created, changed or deleted.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from prefect import flow, get_run_logger

from flows.runtime import flow_settings, make_task_runner
from flows.studies import Factor
from nltrain import evaluate
from tasks.cell import CellRuntime, prepare_cell, simulate_data
from tasks.config import CellConfig, Reuse, RunConfig, TrackingConfig
from tasks.config.user_modules import find_user_modules
from tasks.engine import run_cells
from tasks.modelio import load_model
from tasks.reports import Format, Table, TableCell, number, render_table
from tasks.results import CellResult
from tasks.tracking import Metrics, RunRecord, RunTags, Tracking, connect, parent_run

__all__ = [
    "DataMismatch",
    "ModelRef",
    "ReproduceResult",
    "ReproductionMismatch",
    "Verification",
    "ablation_cells",
    "ablation_table",
    "deleted_run_warning",
    "model_code_problem",
    "reproduce",
    "reproduce_flow",
    "resolve_model",
    "verify_registered",
]

#: The logged and re-evaluated test RMSE must agree to this.
TOLERANCE = 1e-9


class DataMismatch(RuntimeError):
    """The registered run's data set can no longer be rebuilt identically."""


class ReproductionMismatch(RuntimeError):
    """The registered weights do not give the logged test RMSE."""


# -- registry lookup (through Registry.model_version) ---------------------------------------------
@dataclass(frozen=True)
class ModelRef:
    uri: str
    name: str
    version: str
    run_id: str
    run_deleted: bool = False  # the source run is soft-deleted (restorable) but still usable

    @property
    def label(self) -> str:
        """``NAME version N`` (a registered version), else ``logged model NAME``."""
        if self.version:
            return f"{self.name} version {self.version}"
        return f"logged model {self.name}"


def resolve_model(tracking: Tracking, uri: str) -> ModelRef:
    """The model and its source run of a model URI: ``models:/NAME@ALIAS``,
    ``models:/NAME/VERSION``, ``models:/m-<logged model id>`` or ``runs:/<run id>/model``.

    Raises ``LookupError`` in one line when there is no such version, or when its source run
    was purged from the store or its model artifact is missing (naming that run).
    """
    name, version, run_id = tracking.registry.model_version(uri)
    if not run_id:
        raise LookupError(f"{uri!r} ({name} {version}) has no source run to reproduce".strip())
    # a soft-deleted run is still usable (with a warning) while its model is there
    problem = tracking.registry.run_problem(run_id, allow_deleted=True)
    if problem is not None:
        what = f"version {version} of {name!r}" if version else f"logged model {name!r}"
        method = _recorded_method(tracking, run_id)
        code = None if method is None else model_code_problem(method)
        if code is not None:  # the weights are there; the class that reads them is not
            raise LookupError(f"{uri} points at {what} (run {run_id}), but {code}")
        raise LookupError(
            f"{uri} points at {what} (run {run_id}), but {problem}; run "
            f"`nllab benchmark` again to train and register a new champion"
        )
    deleted = tracking.queries.get_run_data(run_id).deleted
    return ModelRef(uri, name, version, run_id, deleted)


def _recorded_method(tracking: Tracking, run_id: str) -> str | None:
    """The method tag of run ``run_id``, or ``None`` when the run cannot be read (purged)."""
    try:
        return tracking.queries.get_run_data(run_id).tags.get(RunTags.METHOD) or None
    except Exception:
        return None


def model_code_problem(method: str) -> str | None:
    """Why the class of model ``method`` cannot be imported in this process, with how to make
    it importable (its module on Python's path, or its package installed), or ``None``."""
    from nlmodels import MODELS
    from nlmodels.model_registry import find_model

    fix = "then run this again (no retraining needed: the weights are stored)"
    try:
        find_user_modules({"methods": [method]})  # a module:Class beside the user
        find_model(method)  # a plugin, or the module:Class spelling
    except ValueError as e:
        return (
            f"its model class cannot be imported here: {e}; put its module on Python's path "
            f"(PYTHONPATH=<the folder holding it>) or pip install its package, {fix}"
        )
    if method not in MODELS:
        return (
            f"no installed package provides its model {method!r} (an nllab.models plugin): "
            f"pip install the package that registers it, {fix}"
        )
    return None


def deleted_run_warning(ref: ModelRef) -> str | None:
    """The one-line warning for a model whose source run is soft-deleted, or ``None``."""
    if not ref.run_deleted:
        return None
    return (
        f"warning: the source run {ref.run_id} of {ref.uri} is deleted (restore it in the "
        "MLflow UI, or `mlflow gc` will purge it and this model with it)"
    )


# -- verification -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verification:
    ref: ModelRef
    cell: CellConfig
    profile: str
    dataset_hash: str
    logged_rmse: float
    test_rmse: float

    @property
    def difference(self) -> float:
        return abs(self.test_rmse - self.logged_rmse)


def _recorded_cell(
    spec_cell: Mapping[str, Any], tags: Mapping[str, str], run_id: str
) -> CellConfig:
    cell = CellConfig.model_validate(dict(spec_cell))
    recorded = tags.get(RunTags.CONFIG_HASH)
    if recorded and cell.config_hash() != recorded:
        raise DataMismatch(
            f"run {run_id}: its recorded config no longer hashes to {recorded[:12]} "
            f"(now {cell.config_hash()[:12]}): the config schema changed since it was trained"
        )
    return cell


def verify_registered(
    uri: str, tracking: TrackingConfig | None = None, *, fresh_data: bool = False
) -> Verification:
    """Rebuild the data of a registered model and check its logged test RMSE (to 1e-9).

    ``fresh_data``: simulate into an empty folder instead of reading the data cache.
    """
    opened = connect(tracking)
    ref = resolve_model(opened, uri)
    run = opened.queries.get_run_data(ref.run_id)
    tags, metrics = run.tags, run.metrics
    if Metrics.TEST_RMSE not in metrics:
        raise LookupError(f"source run {ref.run_id} of {uri!r} has no logged test_rmse")
    # a model or simulator of the user's: looked up as a config's are (no config file here)
    find_user_modules({"methods": [tags.get(RunTags.METHOD, "")]})
    with tempfile.TemporaryDirectory(prefix="nllab-reproduce-") as tmp:
        model, spec = load_model(opened.registry.download_model(uri, Path(tmp) / "model"))
        source = dict(spec.cell.get("data") or {}).get("source") or {}
        find_user_modules({"define_systems": {str(spec.cell.get("system")): source}})
        cell = _recorded_cell(spec.cell, tags, ref.run_id)
        recorded_hash = tags.get("dataset_hash") or spec.dataset_fingerprint
        cache = Path(tmp) / "data" if fresh_data else None
        ds = simulate_data(cell.system, cell.data, cell.seed, cache)
        if ds.fingerprint != recorded_hash:
            raise DataMismatch(
                f"the data set of {uri!r} (run {ref.run_id}) can no longer be rebuilt: it was "
                f"{recorded_hash[:16]}…, the same request now gives {ds.fingerprint[:16]}… "
                "(the simulator or DATA_VERSION changed). Check out the source commit "
                f"{tags.get('mlflow.source.git.commit', 'unknown')} to reproduce it."
            )
        prepared = prepare_cell(cell, ds)
        if tags.get("split_hash") and prepared.fingerprint != tags["split_hash"]:
            raise DataMismatch(
                f"run {ref.run_id}: the train/val/test split changed (was "
                f"{tags['split_hash'][:16]}…, now {prepared.fingerprint[:16]}…)"
            )
        ev, _ = evaluate(
            model,
            prepared.test,
            prepared.normaliser,
            device="cpu",
            dtype=cell.training.dtype,
            batch_size=cell.training.batch_size,
        )
    return Verification(
        ref=ref,
        cell=cell,
        profile=tags.get("profile", "quick"),
        dataset_hash=ds.fingerprint,
        logged_rmse=float(metrics[Metrics.TEST_RMSE]),
        test_rmse=float(ev.test_rmse),
    )


# -- ablations ----------------------------------------------------------------------------------
def _ablations() -> dict[str, Factor]:
    """The ablation studies' factors, by study name: one definition serves both."""
    from flows.studies import STUDIES

    return {name: st.spec.factor for name, st in STUDIES.items() if st.spec.factor is not None}


def _own_value(factor: Factor, cell: CellConfig) -> Any:
    """The source cell's value of ``factor`` (the model's own default without an override)."""
    if factor.section == "data":
        return getattr(cell.data, factor.key)
    if factor.key in cell.model:
        return cell.model[factor.key]
    import inspect

    from nlmodels import MODELS

    param = inspect.signature(MODELS[cell.method]).parameters.get(factor.key)
    return None if param is None else param.default


def ablation_cells(cell: CellConfig, ablation: str) -> list[tuple[Any, CellConfig]]:
    """``(value, cell)`` for every value of the ablation, the source's own value included."""
    factors = _ablations()
    if ablation not in factors:
        raise ValueError(f"unknown ablation {ablation!r}; valid: {', '.join(factors)}")
    a = factors[ablation]
    if a.methods is not None and cell.method not in a.methods:
        raise ValueError(
            f"ablation {ablation!r} applies to {', '.join(a.methods)}, not to {cell.method!r}"
        )
    own = _own_value(a, cell)
    values = (own, *[v for v in a.values if v != own])
    out = []
    for v in values:
        data = cell.model_dump(mode="json")
        data[a.section] = {**data[a.section], a.key: v}
        variant = CellConfig.model_validate(data)
        # The source's own value keeps the source config exactly (same hash), not an override.
        out.append((v, cell if v == own else variant))
    return out


@dataclass(frozen=True)
class ReproduceResult:
    verification: Verification
    ablation: str | None
    run_id: str | None  # the reproduce run (parent of the ablation cells)
    cells: tuple[tuple[Any, CellResult], ...]
    seconds: float


def _run_config(
    v: Verification,
    max_workers: int,
    task_runner: str,
    address: str | None,
    pack: bool = True,
    reuse: Reuse = "numerics",
) -> RunConfig:
    return RunConfig(
        profile=v.profile,
        systems=(v.cell.system,),
        methods=(v.cell.method,),
        seeds=(v.cell.seed,),
        max_workers=max_workers,
        task_runner=task_runner,
        dask_address=address,
        progress=False,
        pack=pack,
        reuse=reuse,
        tracking=TrackingConfig(register_models=False),
    )


@flow(name="nllab-reproduce", log_prints=True)
def reproduce_flow(
    uri: str,
    ablation: str | None = None,
    max_workers: int = 2,
    task_runner: str = "thread",
    dask_address: str | None = None,
    fresh_data: bool = False,
    pack: bool = True,
    reuse: Reuse = "numerics",
) -> ReproduceResult:
    """Verify a registered model, then re-run ``ablation`` from its config, linked to its run."""
    logger = get_run_logger()
    t0 = time.perf_counter()
    v = verify_registered(uri, fresh_data=fresh_data)
    if v.difference > TOLERANCE:
        raise ReproductionMismatch(
            f"{uri} (run {v.ref.run_id}): re-evaluated test RMSE {v.test_rmse!r} differs from "
            f"the logged {v.logged_rmse!r} by {v.difference:.3g} (> {TOLERANCE})"
        )
    logger.info("%s: test RMSE %.12g reproduced (logged %.12g)", uri, v.test_rmse, v.logged_rmse)
    variants = ablation_cells(v.cell, ablation) if ablation else []
    tracking = connect()
    link = {RunTags.SOURCE_RUN: v.ref.run_id, RunTags.SOURCE_MODEL: uri}
    registered = {"registered_model": v.ref.name, "model_version": v.ref.version}
    tags = {
        **link,
        **(registered if v.ref.version else {"logged_model": v.ref.name}),
        RunTags.DATASET_HASH: v.dataset_hash,
        "ablation": ablation or "none",
    }
    results: list[tuple[Any, CellResult]] = []
    with parent_run(
        tracking.runs,
        f"reproduce-{v.ref.name}" + (f"-v{v.ref.version}" if v.ref.version else ""),
        kind="reproduce",
        tags=tags,
        source_run_id=v.ref.run_id,
    ) as run:
        run_id = run.run_id
        tracking.runs.log_metrics(
            run_id,
            {
                Metrics.TEST_RMSE: v.test_rmse,
                "logged_test_rmse": v.logged_rmse,
                "abs_difference": v.difference,
            },
        )
        if ablation and variants:  # (variants only of an ablation)
            config = _run_config(v, max_workers, task_runner, dask_address, pack, reuse)
            results = _ablate(tracking, run_id, v, variants, config, {**link, "ablation": ablation})
            tracking.runs.log_text(run_id, ablation_table(ablation, results), "ablation.md")
            run.record_cells([r for _, r in results])
    return ReproduceResult(v, ablation, run_id, tuple(results), time.perf_counter() - t0)


def _ablate(
    tracking: Tracking,
    parent: str,
    v: Verification,
    variants: list[tuple[Any, CellConfig]],
    config: RunConfig,
    link: dict[str, str],
) -> list[tuple[Any, CellResult]]:
    """The ablation's variants of the verified cell trained under run ``parent`` (the verified
    cell itself reused from its run), each finished variant's run tagged ``link`` and its value."""
    runtime = CellRuntime.for_config(tracking.store, config, parent, device="cpu")
    source = CellResult.reused(
        v.cell, RunRecord(v.ref.run_id, v.cell.config_hash(), v.logged_rmse, {})
    )
    done = iter(_run_ablation([c for _, c in variants if c is not v.cell], runtime, config))
    results: list[tuple[Any, CellResult]] = []
    for value, c in variants:
        r = source if c is v.cell else next(done)
        if r is not source and r.run_id and r.status == "finished":
            tracking.runs.set_tags(r.run_id, {**link, "value": value})
        results.append((value, r))
    return results


def _run_ablation(
    todo: list[CellConfig], runtime: CellRuntime, config: RunConfig
) -> list[CellResult]:
    # Run from a subflow so the ablation cells use the configured task runner.
    @flow(name="nllab-reproduce-ablation", task_runner=make_task_runner(config))
    def ablation_subflow() -> list[CellResult]:
        return run_cells(todo, runtime)

    return ablation_subflow()


def ablation_table(
    name: str | None, rows: list[tuple[Any, CellResult]], fmt: Format = "markdown"
) -> str:
    """An ablation's cells: the value, how the cell ended, its test RMSE and run id, in Markdown
    (logged as ``ablation.md``) or for the terminal (printed by ``nllab reproduce``)."""
    cells = [
        (
            TableCell(str(value)),
            TableCell(r.status),
            TableCell("" if r.test_rmse is None else number(r.test_rmse)),
            TableCell(r.run_id or ""),
        )
        for value, r in rows
    ]
    return render_table(Table((str(name), "status", "test RMSE", "run"), tuple(cells)), fmt)


def reproduce(uri: str, ablation: str | None = None, **kwargs: Any) -> ReproduceResult:
    # A wrong URI, a purged run or a missing model fails here, in seconds, before Prefect
    # starts (``LookupError``).
    warning = deleted_run_warning(resolve_model(connect(), uri))
    if warning is not None:
        print(f"nllab reproduce: {warning}", file=sys.stderr)
    with flow_settings():
        return reproduce_flow(uri, ablation, **kwargs)
