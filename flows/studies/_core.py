"""The study runner: a study is its spec and its body.

A :class:`Study` pairs a :class:`StudySpec` (name, title, the paper's numbers) with a body, a
function of a :class:`StudyContext` returning a :class:`StudyOutput`; it becomes a Prefect flow
``nllab-study-<name>`` that (1) opens one MLflow parent run tagged ``nllab.kind =
study:<name>``, (2) lets the body train or reuse cells as child runs through the cell engine
(:func:`tasks.engine.run_cells`: a cell with a finished run of the same config hash is reused,
never retrained) or run its measurement tasks, and (3) logs the tables (CSV + Markdown), figures
(PNG) and the paper's published numbers (``paper.json``) as artifacts of the parent run, under
``study/``.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from prefect import Flow

from datasets import Prepared
from flows._study_catalog import STUDY_CATALOG
from flows.runtime import artifact_key, flow_settings, make_task_runner, publish_table
from flows.studies._config import StudyConfig
from flows.studies._tables import add_paper, aggregate, rmse_records, to_markdown
from tasks.cell import CellRuntime, prepare_cell, simulate_data
from tasks.config import (
    PAPER_BUDGET_PROFILES,
    CellConfig,
    DataConfig,
    Profile,
    RunConfig,
    TrainConfig,
)
from tasks.engine import run_cells
from tasks.ledger.measured import Measured
from tasks.modelio import ModelSpec, load_model
from tasks.results import CellResult, by_config_hash
from tasks.tracking import Metrics, Queries, RunTags, connect, parent_run

__all__ = [
    "Factor",
    "Study",
    "StudyContext",
    "StudyMeasure",
    "StudyOutput",
    "StudySpec",
    "StudySummary",
    "execute_study",
    "rmse_table",
    "rmse_table_and_results",
    "run_model",
]

ARTIFACT_DIR = "study"


@dataclass(frozen=True)
class Factor:
    """The one setting an ablation study varies: ``section`` (``model`` keyword arguments or
    ``data`` settings), ``key``, the values it takes and the methods it applies to (None: all).

    ``nllab reproduce --ablation NAME`` varies the same factor from a registered model's config.
    """

    section: Literal["model", "data"]
    key: str
    values: tuple[Any, ...]
    methods: tuple[str, ...] | None = None

    def setting(self, value: Any) -> dict[str, dict[str, Any]]:
        """``{section: {key: value}}``, as :meth:`StudyContext.cell` takes it."""
        return {self.section: {self.key: value}}


@dataclass(frozen=True)
class StudySpec:
    """What a study reproduces: its name, title, the paper's table/figure and numbers, and
    (for ablations) the factor it varies."""

    name: str
    #: Published numbers: row key (the table's key columns, as strings) -> value.
    paper: Mapping[tuple[str, ...], float] = field(default_factory=dict)
    metric: str = "test RMSE"
    higher_is_better: bool = False
    factor: Factor | None = None
    #: the table's columns that ``paper`` is keyed by (None: all the table's key columns)
    paper_keys: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.name not in STUDY_CATALOG:
            raise ValueError(f"study {self.name!r} is not in flows._study_catalog")

    @property
    def title(self) -> str:
        return STUDY_CATALOG[self.name].title

    @property
    def paper_ref(self) -> str:
        return STUDY_CATALOG[self.name].paper_ref


@dataclass(frozen=True)
class StudyOutput:
    """What a study body returns: tables by name (figures are written to ``ctx.figure``)."""

    tables: Mapping[str, pd.DataFrame]
    notes: str = ""


@dataclass(frozen=True)
class StudySummary:
    study: str
    profile: str
    parent_run_id: str
    tables: Mapping[str, pd.DataFrame]
    figures: tuple[str, ...]
    cells: tuple[CellResult, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cells)


#: A study's body: what it trains or measures, given its context.
StudyBody = Callable[["StudyContext"], StudyOutput]
#: What a study measures of one trained cell beyond its test RMSE: the cell, its MLflow run and
#: the store's queries -> its numbers and curves (recorded in the ledger with the cell's record).
StudyMeasure = Callable[[CellConfig, str, Queries], Measured]


@dataclass(frozen=True)
class Study:
    """A registered study: its spec and its body, run as the Prefect flow ``nllab-study-<name>``."""

    spec: StudySpec
    body: StudyBody
    #: what it measures of each trained cell beyond the test RMSE (None: nothing)
    measure: StudyMeasure | None = None

    @cached_property
    def flow(self) -> Flow[[StudyConfig], StudySummary]:
        """The study's flow: :func:`execute_study` of this spec and body."""
        spec, body = self.spec, self.body

        def study_flow(config: StudyConfig) -> StudySummary:
            return execute_study(spec, config, body)

        study_flow.__name__ = study_flow.__qualname__ = f"{spec.name.replace('-', '_')}_flow"
        return Flow(
            study_flow,
            name=f"nllab-study-{spec.name}",
            description=f"{spec.title} (paper: {spec.paper_ref})",
        )

    def run(self, config: StudyConfig) -> StudySummary:
        """Call the flow with the profile's capped task runner and the shared flow settings."""
        with flow_settings():
            return self.flow.with_options(task_runner=make_task_runner(config.run))(config)


@dataclass(frozen=True)
class StudyContext:
    """Everything a study body needs: the config, the store's queries, the parent run, a figure
    folder."""

    config: StudyConfig
    spec: StudySpec
    queries: Queries
    parent_run_id: str
    runtime: CellRuntime
    folder: Path
    _results: dict[str, CellResult] = field(default_factory=dict)

    @property
    def profile(self) -> Profile:
        return self.config.profile

    @property
    def run(self) -> RunConfig:
        return self.config.run

    @property
    def seeds(self) -> tuple[int, ...]:
        return self.run.seeds

    def pick(self, *, smoke: Any, quick: Any, paper: Any) -> Any:
        """The value for this profile (``fair`` trains the paper's budget: ``paper``'s)."""
        return {"smoke": smoke, "quick": quick, "paper": paper, "fair": paper}[self.profile]

    def ode_solver(self, solver: str) -> dict[str, Any]:
        """NODE's and ANODE's model settings to solve with ``solver``. At the paper's budget an
        adaptive solver keeps the reference's tolerances (torchdiffeq's defaults, rtol 1e-7 and
        atol 1e-9, for the solve and its adjoint: the reference's ``odeint_adjoint`` call passes
        none); the smoke and quick profiles keep the model's own looser ones, to stay quick."""
        from nlmodels.baselines import ADAPTIVE_SOLVERS, REFERENCE_TOLERANCES

        if solver in ADAPTIVE_SOLVERS and self.profile in PAPER_BUDGET_PROFILES:
            return {"solver": solver, **REFERENCE_TOLERANCES}
        return {"solver": solver}

    def systems(self, default: Sequence[str]) -> tuple[str, ...]:
        return self.config.systems or tuple(default)

    def methods(self, default: Sequence[str]) -> tuple[str, ...]:
        return self.config.methods or tuple(default)

    def figure(self, name: str) -> Path:
        """Where the body saves figure ``name`` (PNG); every PNG there is logged."""
        path = self.folder / "figures" / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def cell(
        self,
        system: str,
        method: str,
        seed: int,
        *,
        data: Mapping[str, Any] | None = None,
        training: Mapping[str, Any] | None = None,
        model: Mapping[str, Any] | None = None,
    ) -> CellConfig:
        """A cell of the profile with data/training/model variations (validated)."""
        return CellConfig(
            system=system,
            method=method,
            seed=seed,
            data=DataConfig.model_validate(
                {**self.run.data_for(system).model_dump(), **(data or {})}
            ),
            training=TrainConfig.model_validate(
                {**self.run.training.model_dump(), **(training or {})}
            ),
            model={**self.run.models.get(method, {}), **(model or {})},
        )

    def factor_cells(
        self,
        systems: Sequence[str],
        values: Sequence[Any],
        methods: Sequence[str] | None = None,
        *,
        label: Callable[[Any], Any] | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> list[tuple[dict[str, Any], CellConfig]]:
        """``(labels, cell)`` for every system × value of the spec's :class:`Factor` × method ×
        seed, labelled ``system``, the factor's key (``label(value)``) and ``method``; the
        methods default to the factor's. ``data``: data settings every cell takes besides the
        factor's (e.g. where its noise is added)."""
        factor = self.spec.factor
        if factor is None:
            raise ValueError(f"study {self.spec.name!r} declares no factor")

        def setting(value: Any) -> dict[str, dict[str, Any]]:
            out = factor.setting(value)
            if data:
                out["data"] = {**data, **out.get("data", {})}
            return out

        return [
            (
                {"system": s, factor.key: label(v) if label else v, "method": m},
                self.cell(s, m, seed, **setting(v)),
            )
            for s in systems
            for v in values
            for m in methods or factor.methods or ()
            for seed in self.seeds
        ]

    def run_cells(self, cells: Sequence[CellConfig]) -> list[CellResult]:
        """Train (or reuse, by config hash) ``cells`` as child runs; results in input order."""
        results = run_cells(cells, self.runtime)
        for h, r in by_config_hash(results).items():
            self._results.setdefault(h, r)
        return results

    def prepared(self, cell: CellConfig) -> Prepared:
        """The cell's split data (from the data cache), exactly as its training saw it."""
        ds = simulate_data(cell.system, cell.data, cell.seed, self.runtime.cache_dir)
        return prepare_cell(cell, ds)

    def load_model(self, result: CellResult) -> tuple[Any, ModelSpec]:
        """The trained model of a finished cell, from its run's ``model`` artifact (CPU)."""
        if not result.ok or result.run_id is None:
            raise ValueError(f"cell {result.key} has no trained model ({result.status})")
        return run_model(self.queries, result.run_id)

    def measured(self, result: CellResult, compute: Callable[[], Measured]) -> Measured:
        """What the study measures of a cell's trained model besides its test RMSE (numbers
        and curves, as the results ledger records them): ``compute()`` for a finished cell,
        nothing for one that did not finish. Drawn from the ledger, the record's instead
        (:func:`flows.studies.recorded_output`)."""
        return compute() if result.ok else Measured()

    def measurement(self, name: str, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """A table the study measures without training a cell: timings, or pure maths
        (``compute()``). It is no cell's result (a timing is the machine's, not the model's),
        so the ledger keeps no record of it: drawn from the ledger, the committed measurement
        ``results/measurements/NAME.json`` stands in (``benchmarks/study_measurements.py
        --record`` writes it; :func:`flows.studies.recorded_output`), and planned, nothing is
        measured (an empty table)."""
        return compute()

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of a logged metric."""
        return self.queries.metric_history(run_id, key)


def run_model(queries: Queries, run_id: str) -> tuple[Any, ModelSpec]:
    """The trained model of the finished run ``run_id``, from its ``model`` artifact (CPU)."""
    with tempfile.TemporaryDirectory(prefix="nllab-study-model-") as tmp:
        path = queries.download(run_id, "model", tmp)
        return load_model(path)


def rmse_table(
    ctx: StudyContext, entries: Sequence[tuple[Mapping[str, Any], CellConfig]], keys: Sequence[str]
) -> pd.DataFrame:
    """Run (or reuse) the cells of ``entries`` (labels, cell) and tabulate test RMSE per key,
    mean over seeds, beside the paper's figure from ``ctx.spec.paper``."""
    return rmse_table_and_results(ctx, entries, keys)[0]


def rmse_table_and_results(
    ctx: StudyContext, entries: Sequence[tuple[Mapping[str, Any], CellConfig]], keys: Sequence[str]
) -> tuple[pd.DataFrame, list[CellResult]]:
    """:func:`rmse_table` and the cells' results, in the order of ``entries``."""
    results = ctx.run_cells([c for _, c in entries])
    records = rmse_records(results, [lab for lab, _ in entries])
    spec = ctx.spec
    table = add_paper(
        aggregate(records, keys),
        keys,
        spec.paper,
        higher_is_better=spec.higher_is_better,
        paper_keys=spec.paper_keys,
    )
    return table, results


def execute_study(spec: StudySpec, config: StudyConfig, body: StudyBody) -> StudySummary:
    """Run ``body`` under one parent run and log its tables, figures and the paper's numbers."""
    t0 = time.perf_counter()
    tracking = connect(config.run.tracking)
    with parent_run(
        tracking.runs,
        f"study-{spec.name}-{config.profile}",
        kind=f"study:{spec.name}",
        tags={RunTags.STUDY: spec.name, RunTags.PROFILE: config.profile},
        params={
            "study": spec.name,
            "profile": config.profile,
            "seeds": ",".join(map(str, config.run.seeds)),
            "systems": ",".join(config.systems or ()) or "default",
            "methods": ",".join(config.methods or ()) or "default",
        },
        execution=config.run.execution.model_dump(mode="json"),
        config_json=(config.model_dump_json(indent=2), "study_config.json"),
    ) as run:
        parent = run.run_id
        runtime = CellRuntime.for_config(tracking.store, config.run, parent, progress=False)
        with tempfile.TemporaryDirectory(prefix=f"nllab-study-{spec.name}-") as tmp:
            folder = Path(tmp)
            ctx = StudyContext(config, spec, tracking.queries, parent, runtime, folder)
            out = body(ctx)
            figures = _write_outputs(spec, config, out, folder, time.perf_counter() - t0, ctx)
            tracking.runs.log_artifact(parent, folder / ARTIFACT_DIR, ARTIFACT_DIR)
        for name, frame in out.tables.items():
            publish_table(
                artifact_key("study", spec.name, config.profile, name),
                frame.to_dict("records"),
                f"{spec.title}: {name} (MLflow run {parent})",
            )
        cells = tuple(ctx._results.values())
        run.record_cells(cells)
        seconds = time.perf_counter() - t0
        tracking.runs.log_metrics(parent, {Metrics.STUDY_SECONDS: seconds})
    return StudySummary(
        spec.name, config.profile, parent, dict(out.tables), figures, cells, seconds
    )


def _write_outputs(
    spec: StudySpec,
    config: StudyConfig,
    out: StudyOutput,
    folder: Path,
    seconds: float,
    ctx: StudyContext,
) -> tuple[str, ...]:
    root = folder / ARTIFACT_DIR
    (root / "tables").mkdir(parents=True, exist_ok=True)
    for name, frame in out.tables.items():
        frame.to_csv(root / "tables" / f"{name}.csv", index=False, float_format="%.6g")
        (root / "tables" / f"{name}.md").write_text(to_markdown(frame))
    figures = tuple(sorted(p.name for p in (folder / "figures").glob("*.png")))
    if figures:
        (root / "figures").mkdir(parents=True, exist_ok=True)
        for name in figures:
            (folder / "figures" / name).replace(root / "figures" / name)
    paper = {
        "paper_ref": spec.paper_ref,
        "metric": spec.metric,
        "higher_is_better": spec.higher_is_better,
        "values": [{"key": list(k), "value": v} for k, v in spec.paper.items()],
    }
    (root / "paper.json").write_text(json.dumps(paper, indent=2))
    summary = {
        "study": spec.name,
        "title": spec.title,
        "paper_ref": spec.paper_ref,
        "metric": spec.metric,
        "higher_is_better": spec.higher_is_better,
        "profile": config.profile,
        "tables": sorted(out.tables),
        "figures": list(figures),
        "seconds": round(seconds, 2),
        "cells": [
            {"key": c.key, "status": c.status, "test_rmse": c.test_rmse, "run_id": c.run_id}
            for c in ctx._results.values()
        ],
        "notes": out.notes,
    }
    (root / "study.json").write_text(json.dumps(summary, indent=2))
    return figures
