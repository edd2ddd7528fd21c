"""The one study runner every study flow shares (issue 6).

A study is a Prefect flow that (1) opens one MLflow parent run tagged ``nllab.kind =
study:<name>``, (2) trains or reuses its cells as child runs through ``tasks.cell_task`` (a cell
with a finished run of the same config hash is reused, never retrained) or runs its measurement
tasks, and (3) logs its tables (CSV + Markdown), figures (PNG) and the paper's published numbers
(``paper.json``) as artifacts of the parent run, under ``study/``.

Every study table has the study's key columns followed by :data:`VALUE_COLUMNS`: the mean over
seeds (``value``), its ``std`` and ``n``, the paper's figure (``paper``), the difference
(``gap = value − paper``) and a ``verdict`` (``better``, ``match`` within 10 %, ``worse``).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from prefect import Flow
from prefect.futures import wait
from pydantic import BaseModel, ConfigDict

import tasks._env  # noqa: F401  (offline switches before mlflow/prefect are imported)
from datasets import Prepared
from flows._runtime import flow_settings, make_task_runner
from flows.benchmark import collect_results, stored_results
from tasks.cell import CellRuntime, prepare_cell, simulate_data
from tasks.config import CellConfig, DataConfig, RunConfig, TrainConfig, resolve_config
from tasks.modelio import ModelSpec, load_model
from tasks.prefect_tasks import cell_task, simulate_task
from tasks.reporting import CellResult
from tasks.tracking import Tracker

__all__ = [
    "QUICK_TRAINING",
    "VALUE_COLUMNS",
    "Study",
    "StudyConfig",
    "StudyContext",
    "StudyOutput",
    "StudySpec",
    "StudySummary",
    "add_paper",
    "aggregate",
    "execute_study",
    "plot_bars",
    "plot_lines",
    "rmse_table",
    "rmse_table_and_results",
    "study_config",
]

Profile = Literal["smoke", "quick", "paper"]
VALUE_COLUMNS: tuple[str, ...] = ("value", "std", "n", "paper", "gap", "verdict")
#: Training budget of every study cell in the ``quick`` profile, on top of the profile's own
#: (30 epochs, patience 10): 20 s per cell keeps all twelve studies within an hour on 2 cores.
QUICK_TRAINING: dict[str, Any] = {"max_train_seconds": 20.0}
#: Relative distance to the paper's figure that still counts as a match.
MATCH_TOLERANCE = 0.10
ARTIFACT_DIR = "study"


class StudyConfig(BaseModel):
    """A study run: the resolved profile plus optional system/method selections."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    study: str
    run: RunConfig
    systems: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None

    @property
    def profile(self) -> Profile:
        return self.run.profile


def study_config(
    study: str,
    profile: str | None = "quick",
    *,
    systems: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    device: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> StudyConfig:
    """Resolve a study's configuration (profile ← :data:`QUICK_TRAINING` ← ``overrides``).

    ``systems``/``methods`` are validated like the benchmark's (unknown names list the valid ones).
    """
    layer: dict[str, Any] = {"seeds": list(seeds) if seeds else None, "device": device}
    if (profile or "quick") == "quick":
        layer["training"] = dict(QUICK_TRAINING)
    if systems:
        layer["systems"] = list(systems)
    if methods:
        layer["methods"] = list(methods)
    for k, v in (overrides or {}).items():
        if isinstance(v, Mapping) and isinstance(layer.get(k), Mapping):
            layer[k] = {**layer[k], **v}
        else:
            layer[k] = v
    run = resolve_config(profile, None, layer)
    return StudyConfig(
        study=study,
        run=run,
        systems=tuple(systems) if systems else None,
        methods=tuple(methods) if methods else None,
    )


@dataclass(frozen=True)
class StudySpec:
    """What a study reproduces: its name, title, the paper's table/figure and numbers."""

    name: str
    title: str
    paper_ref: str
    #: Published numbers: row key (the table's key columns, as strings) -> value.
    paper: Mapping[tuple[str, ...], float] = field(default_factory=dict)
    metric: str = "test RMSE"
    higher_is_better: bool = False


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


@dataclass(frozen=True)
class Study:
    """A registered study: its spec and its Prefect flow."""

    spec: StudySpec
    flow: Flow

    def run(self, config: StudyConfig) -> StudySummary:
        """Call the flow with the profile's capped task runner and the shared flow settings."""
        with flow_settings():
            return self.flow.with_options(task_runner=make_task_runner(config.run))(config)


@dataclass(frozen=True)
class StudyContext:
    """Everything a study body needs: the config, the tracker, the parent run, a figure folder."""

    config: StudyConfig
    spec: StudySpec
    tracker: Tracker
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
        """The value for this profile."""
        return {"smoke": smoke, "quick": quick, "paper": paper}[self.profile]

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
            data=DataConfig.model_validate({**self.run.data.model_dump(), **(data or {})}),
            training=TrainConfig.model_validate(
                {**self.run.training.model_dump(), **(training or {})}
            ),
            model={**self.run.models.get(method, {}), **(model or {})},
        )

    def run_cells(self, cells: Sequence[CellConfig]) -> list[CellResult]:
        """Train (or reuse, by config hash) ``cells`` as child runs; results in input order."""
        unique = list({c.config_hash(): c for c in cells}.values())
        reused, todo = stored_results(self.tracker, unique)
        wait([simulate_task.submit(s, d, seed) for s, d, seed in _data_keys(todo)])
        futures = {c.config_hash(): cell_task.submit(c, self.runtime) for c in todo}
        wait(list(futures.values()))
        fallback = {
            c.config_hash(): CellResult(
                c.system, c.method, c.seed, "failed", config_hash=c.config_hash()
            )
            for c in todo
        }
        new = collect_results(futures, fallback)
        by_hash = {r.config_hash: r for r in [*reused, *new]}
        for h, r in by_hash.items():
            self._results.setdefault(h, r)
        return [by_hash[c.config_hash()] for c in cells]

    def prepared(self, cell: CellConfig) -> Prepared:
        """The cell's split data (from the data cache), exactly as its training saw it."""
        ds = simulate_data(cell.system, cell.data, cell.seed, self.runtime.cache_dir)
        return prepare_cell(cell, ds)

    def load_model(self, result: CellResult) -> tuple[Any, ModelSpec]:
        """The trained model of a finished cell, from its run's ``model`` artifact (CPU)."""
        if not result.ok or result.run_id is None:
            raise ValueError(f"cell {result.key} has no trained model ({result.status})")
        with tempfile.TemporaryDirectory(prefix="nllab-study-model-") as tmp:
            path = self.tracker.download(result.run_id, "model", tmp)
            return load_model(path)

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of a logged metric."""
        return self.tracker.metric_history(run_id, key)


def _data_keys(cells: Iterable[CellConfig]) -> list[tuple[str, DataConfig, int]]:
    seen: dict[str, tuple[str, DataConfig, int]] = {}
    for c in cells:
        seen.setdefault(
            f"{c.system}|{c.data.model_dump_json()}|{c.seed}", (c.system, c.data, c.seed)
        )
    return list(seen.values())


# -- tables ---------------------------------------------------------------------------------
def aggregate(records: Iterable[Mapping[str, Any]], keys: Sequence[str]) -> pd.DataFrame:
    """Mean/std/n over seeds of ``value`` per key (NaN values count as missing).

    Population std, as the main table. Row order follows first appearance.
    """
    rows: dict[tuple, list[float]] = {}
    for r in records:
        k = tuple(r[c] for c in keys)
        v = r.get("value")
        rows.setdefault(k, [])
        if v is not None and np.isfinite(v):
            rows[k].append(float(v))
    out = []
    for k, vals in rows.items():
        a = np.asarray(vals, dtype=float)
        out.append(
            {
                **dict(zip(keys, k)),
                "value": float(a.mean()) if a.size else math.nan,
                "std": float(a.std()) if a.size else math.nan,
                "n": int(a.size),
            }
        )
    return pd.DataFrame(out, columns=[*keys, "value", "std", "n"])


def add_paper(
    frame: pd.DataFrame,
    keys: Sequence[str],
    paper: Mapping[tuple[str, ...], float],
    *,
    higher_is_better: bool = False,
    tolerance: float = MATCH_TOLERANCE,
) -> pd.DataFrame:
    """Add ``paper``, ``gap`` (ours − paper) and ``verdict`` columns."""
    out = frame.copy()
    pub = [paper.get(tuple(str(row[k]) for k in keys), math.nan) for _, row in out.iterrows()]
    out["paper"] = np.asarray(pub, dtype=float)
    out["gap"] = out["value"] - out["paper"]
    out["verdict"] = [
        verdict(v, p, higher_is_better, tolerance)
        for v, p in zip(out["value"], out["paper"], strict=True)
    ]
    return out


def verdict(value: float, paper: float, higher_is_better: bool, tolerance: float) -> str:
    """``better``/``match``/``worse`` against the paper; ``–`` without a figure or a value."""
    if not (np.isfinite(value) and np.isfinite(paper)):
        return "–"
    if abs(value - paper) <= tolerance * abs(paper):
        return "match"
    return "better" if (value > paper) == higher_is_better else "worse"


def rmse_records(
    results: Sequence[CellResult], labels: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per-seed rows ``{**label, value: test RMSE}`` for results and their key labels."""
    return [
        {**lab, "value": r.test_rmse if r.ok else math.nan}
        for r, lab in zip(results, labels, strict=True)
    ]


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
    table = add_paper(
        aggregate(records, keys), keys, ctx.spec.paper, higher_is_better=ctx.spec.higher_is_better
    )
    return table, results


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table, numbers with 4 significant digits, verdicts marked."""
    from tasks.reporting import Table, render_table

    return render_table(Table.from_frame(frame), "markdown")


# -- figures --------------------------------------------------------------------------------
def plot_lines(
    frame: pd.DataFrame,
    x: str,
    hue: str,
    path: Path,
    *,
    title: str,
    ylabel: str = "test RMSE",
    logx: bool = False,
    logy: bool = False,
    panel: str | None = None,
) -> Path:
    """``value`` against ``x`` per ``hue`` (± std), the paper's figures as crosses."""
    panels = list(dict.fromkeys(frame[panel])) if panel else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), squeeze=False)
    for ax, pv in zip(axes[0], panels, strict=True):
        sub = frame if pv is None else frame[frame[panel] == pv]
        for i, (h, g) in enumerate(sub.groupby(hue, sort=False)):
            xs = np.asarray(g[x], dtype=float)
            ax.errorbar(
                xs, g["value"], yerr=g["std"], marker="o", ms=3, label=str(h), color=f"C{i}"
            )
            if "paper" in g and np.isfinite(g["paper"]).any():
                ax.plot(xs, g["paper"], "x", color=f"C{i}", ms=7)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_title(str(pv) if pv is not None else "")
        ax.legend(fontsize=7)
    fig.suptitle(f"{title}  (× = paper)")
    fig.tight_layout()
    return _save(fig, path)


def plot_bars(
    frame: pd.DataFrame, x: str, hue: str, path: Path, *, title: str, ylabel: str = "test RMSE"
) -> Path:
    """Grouped bars of ``value`` (± std) per ``x`` and ``hue``; the paper's figures as crosses."""
    xs = list(dict.fromkeys(frame[x]))
    hues = list(dict.fromkeys(frame[hue]))
    width = 0.8 / max(len(hues), 1)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(xs) * max(1, len(hues) / 2)), 3.4))
    for i, h in enumerate(hues):
        g = frame[frame[hue] == h].set_index(x).reindex(xs)
        pos = np.arange(len(xs)) + (i - (len(hues) - 1) / 2) * width
        ax.bar(pos, g["value"], width, yerr=g["std"], label=str(h), color=f"C{i}")
        if "paper" in g:
            ax.plot(pos, g["paper"], "kx", ms=6)
    ax.set_xticks(np.arange(len(xs)), [str(v) for v in xs], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    ax.set_title(f"{title}  (× = paper)")
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- the runner -----------------------------------------------------------------------------
def execute_study(
    spec: StudySpec, config: StudyConfig, body: Callable[[StudyContext], StudyOutput]
) -> StudySummary:
    """Run ``body`` under one parent run and log its tables, figures and the paper's numbers."""
    t0 = time.perf_counter()
    tracker = Tracker.connect(config.run.tracking)
    tags = {
        "nllab.kind": f"study:{spec.name}",
        "nllab.study": spec.name,
        "profile": config.profile,
    }
    with tracker.run(f"study-{spec.name}-{config.profile}", tags) as parent:
        tracker.log_params(
            parent,
            {
                "study": spec.name,
                "profile": config.profile,
                "seeds": ",".join(map(str, config.run.seeds)),
                "systems": ",".join(config.systems or ()) or "default",
                "methods": ",".join(config.methods or ()) or "default",
                "device": config.run.device,
            },
        )
        tracker.log_text(parent, config.model_dump_json(indent=2), "study_config.json")
        runtime = CellRuntime.for_tracker(
            tracker,
            parent_run_id=parent,
            profile=config.profile,
            device=config.run.device,
            progress=False,
            torch_threads=config.run.torch_threads,
        )
        with tempfile.TemporaryDirectory(prefix=f"nllab-study-{spec.name}-") as tmp:
            folder = Path(tmp)
            ctx = StudyContext(config, spec, tracker, parent, runtime, folder)
            out = body(ctx)
            figures = _write_outputs(spec, config, out, folder, time.perf_counter() - t0, ctx)
            tracker.log_artifact(parent, folder / ARTIFACT_DIR, ARTIFACT_DIR)
        cells = tuple(ctx._results.values())
        tracker.set_tags(
            parent,
            {
                "cells": len(cells),
                "cells_failed": sum(not c.ok for c in cells),
                "cells_reused": sum(c.status == "reused" for c in cells),
            },
        )
        seconds = time.perf_counter() - t0
        tracker.log_metrics(parent, {"study_seconds": seconds})
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
