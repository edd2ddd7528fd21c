"""``nllab report``: the main table as the paper's Table 3, every study and tuning study, in one
self-contained HTML page (figures embedded as base64 PNG) and a Markdown report, read from MLflow
through the :class:`~tasks.tracking.Queries`. Only FINISHED parent runs are read.

Every table goes through :func:`tasks.reports.reporting.render_table`, so the terminal, Markdown,
LaTeX and HTML show the same cells: ours beside the paper's figure, the best per column marked and
a verdict (better / match / worse, marked ▲ / ✓ / ▼ and coloured in HTML).

The output folder is shared with the user: the report writes only the files it lists in its
manifest (``.nllab-report.json``, with their hashes), replaces them only while unchanged, and
refuses to replace anything else unless forced.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from flows.reports._report_folder import MANIFEST, OwnedFolder, UnownedFiles
from flows.reports.compare import benchmark_of, benchmark_runs, clock_went_back
from tasks.config import RunConfig
from tasks.reports import (
    PAPER_BUDGET,
    VERDICT_RULE,
    ResultsTable,
    Table,
    TableCell,
    number,
    render_table,
    results_table,
)
from tasks.results import CellResult
from tasks.tracking import Metrics, Queries

#: The command the report suggests when no tuning study has run: complete, as it can be typed.
TUNE_EXAMPLE = "nllab tune --method neural_laplace --system lotka_volterra_dde --trials 10"

__all__ = [
    "MANIFEST",
    "TUNE_EXAMPLE",
    "OwnedFolder",
    "ReportPaths",
    "ReportSection",
    "UnownedFiles",
    "benchmark_config",
    "build_report",
    "collect_sections",
    "main_table_figure",
]


@dataclass(frozen=True)
class ReportSection:
    """One study (or the benchmark) as found in the store."""

    name: str
    title: str
    paper_ref: str
    run_id: str | None
    profile: str
    tables: dict[str, Table]
    figures: dict[str, bytes]
    notes: str = ""
    url: str | None = None  # the parent run in the MLflow UI


@dataclass(frozen=True)
class ReportPaths:
    html: Path
    markdown: Path
    figures: tuple[Path, ...]
    results: tuple[Path, ...] = ()


# -- what the store holds -------------------------------------------------------------------
def benchmark_config(queries: Queries) -> tuple[RunConfig, str] | None:
    """The configuration and run id of the latest finished benchmark with at least one finished
    or reused cell (:func:`flows.reports.compare.benchmark_runs`; one whose every cell failed has
    nothing to report), or ``None``. A parent from an older version without its config is
    passed over. Where the clock went back since some runs, one line says so
    (:func:`flows.reports.compare.clock_went_back`): "latest" is then by start time."""
    runs = benchmark_runs(queries)
    if (line := clock_went_back(runs)) is not None:
        print(f"nllab: {line}", file=sys.stderr)
    for run in runs:
        with tempfile.TemporaryDirectory(prefix="nllab-report-") as tmp:
            try:
                path = queries.download(run.run_id, "run_config.json", tmp)
                return RunConfig.from_json(path.read_text()), run.run_id
            except Exception:
                continue
    return None


def stored_cell_results(
    queries: Queries, config: RunConfig, parent_run_id: str | None = None
) -> list[CellResult]:
    """Every cell of ``config``: its finished run (with the top-share metrics) or ``missing``.

    A cell whose run is a child of ``parent_run_id`` (by default the latest finished benchmark
    with results of the same profile and cells, :func:`flows.reports.compare.benchmark_of`, whatever
    ran since in other profiles) was trained by that benchmark (status ``finished``, shown as
    "trained"); any other finished run was reused from an earlier one (``reused``)."""
    cells = config.cells()
    if parent_run_id is None:
        run = benchmark_of(queries, config.profile, (c.config_hash() for c in cells))
        parent_run_id = run.run_id if run is not None else None
    done = queries.finished_cells(c.config_hash() for c in cells)
    out = []
    for c in cells:
        rec = done.get(c.config_hash())
        if rec is None:
            out.append(CellResult.failed(c, "missing"))
            continue
        r = CellResult.reused(c, rec)
        if parent_run_id is not None and rec.parent_run_id == parent_run_id:
            r = dataclasses.replace(r, status="finished")
        out.append(r)
    return out


#: How the runs table names a cell's status: a cell the benchmark itself ran was trained.
_STATUS_WORDS = {"finished": "trained"}


def _study_section(queries: Queries, name: str, title: str, paper_ref: str, link) -> ReportSection:
    run_id = queries.latest_run(f"study:{name}")
    if run_id is None:
        return ReportSection(name, title, paper_ref, None, "–", {}, {})
    with tempfile.TemporaryDirectory(prefix="nllab-report-") as tmp:
        root = queries.download(run_id, "study", tmp)
        meta = (
            json.loads((root / "study.json").read_text()) if (root / "study.json").exists() else {}
        )
        tables = {
            p.stem: Table.from_frame(pd.read_csv(p))
            for p in sorted((root / "tables").glob("*.csv"))
        }
        figures = {p.name: p.read_bytes() for p in sorted((root / "figures").glob("*.png"))}
    return ReportSection(
        name,
        meta.get("title", title),
        meta.get("paper_ref", paper_ref),
        run_id,
        meta.get("profile", "?"),
        tables,
        figures,
        notes=meta.get("notes", ""),
        url=link(run_id),
    )


def _tuning_section(queries: Queries, link) -> ReportSection:
    runs = queries.finished_runs("tune")
    title, ref = "Hyperparameter tuning (Optuna)", "Appendix (hyperparameters)"
    if not runs:
        return ReportSection("tune", title, ref, None, "–", {}, {})
    rows = []
    for r in runs:
        t, m = r.tags, r.metrics
        best = m.get(Metrics.BEST_VAL_RMSE, float("nan"))
        rows.append(
            (
                TableCell(t.get("optuna.study", "?")),
                TableCell(t.get("method", "?")),
                TableCell(t.get("system", "?")),
                TableCell(t.get("profile", "?")),
                TableCell(number(best)),
                TableCell(str(int(m.get(Metrics.N_TRIALS, 0)))),
                TableCell(t.get("best_trial", "–")),
                TableCell(r.run_id[:12], link=link(r.run_id)),
            )
        )
    header = (
        "study",
        "method",
        "system",
        "profile",
        "best val_rmse",
        "trials",
        "best trial",
        "run",
    )
    table = Table(header, tuple(rows), "Open a study with the printed optuna-dashboard command.")
    return ReportSection("tune", title, ref, runs[0].run_id, "–", {"studies": table}, {})


def main_table_figure(table: ResultsTable) -> bytes:
    """One panel per system: our mean ± std per method as bars, the paper's figure as a black
    tick with its ± band (log scale: the methods differ by orders of magnitude)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems, methods = table.systems, table.methods
    cols = min(3, max(1, len(systems)))
    rows = (len(systems) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    f = table.frame.set_index(["method", "system"])
    x = np.arange(len(methods))
    paper_label = "paper" if table.judged else f"paper ({PAPER_BUDGET})"
    for ax, s in zip(axes.flat, systems):
        ours = [f.loc[(m, s), "mean"] if (m, s) in f.index else np.nan for m in methods]
        std = [f.loc[(m, s), "std"] if (m, s) in f.index else np.nan for m in methods]
        paper = [f.loc[(m, s), "paper_mean"] if (m, s) in f.index else np.nan for m in methods]
        pstd = [f.loc[(m, s), "paper_std"] if (m, s) in f.index else np.nan for m in methods]
        ax.bar(x, ours, yerr=std, color="#4c72b0", capsize=2, label="ours")
        ax.errorbar(x, paper, yerr=pstd, fmt="_", color="k", ms=14, mew=2, label=paper_label)
        ax.set_xticks(x, methods, rotation=35, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(s, fontsize=9)
        ax.set_ylabel("test RMSE")
    for ax in list(axes.flat)[len(systems) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def collect_sections(
    queries: Queries,
    results: Sequence[CellResult] | None = None,
    ui_address: str | None = None,
    profile: str | None = None,
) -> list[ReportSection]:
    """The main table (from ``results``, trained in ``profile``, else the latest finished
    benchmark's cells), every registered study and the tuning studies, latest FINISHED parent
    run each; a section that has none has no ``run_id``."""
    from flows.studies import STUDIES

    def link(run_id: str | None) -> str | None:
        return queries.run_url(ui_address, run_id) if ui_address and run_id else None

    sections = [_benchmark_section(queries, results, profile, link)]
    for name, study in STUDIES.items():
        sections.append(_study_section(queries, name, study.spec.title, study.spec.paper_ref, link))
    sections.append(_tuning_section(queries, link))
    return sections


def _benchmark_section(queries: Queries, results, profile: str | None, link) -> ReportSection:
    title, ref = "Main table", "Table 3 (Table:MainMSE)"
    if results is None:
        found = benchmark_config(queries)
        if found is None:
            return ReportSection("benchmark", title, ref, None, "–", {}, {})
        results, profile = stored_cell_results(queries, found[0]), found[0].profile
        run_id: str | None = found[1]
    elif profile is None:
        raise ValueError("the profile the results were trained in is needed to judge them")
    else:  # the benchmark of these cells, not the latest of any profile
        run = benchmark_of(queries, profile, (r.config_hash for r in results if r.config_hash))
        run_id = run.run_id if run is not None else None
    table = results_table(results, profile=profile)
    # A cell links to the run of its first finished seed.
    links = {}
    for r in results:
        if r.ok and (r.method, r.system) not in links and link(r.run_id):
            links[(r.method, r.system)] = link(r.run_id)
    runs = Table(
        ("cell", "status", "test RMSE", "run"),
        tuple(
            (
                TableCell(r.key),
                TableCell(_STATUS_WORDS.get(r.status, r.status)),
                TableCell(number(r.test_rmse)),
                TableCell((r.run_id or "–")[:12], link=link(r.run_id)),
            )
            for r in results
        ),
    )
    tables = {"results": table.main_table(links)}
    ranking = table.ranking()
    if ranking.rows:
        tables["ranking"] = ranking
    tables["runs"] = runs
    return ReportSection(
        "benchmark",
        title,
        ref,
        run_id,
        profile,
        tables,
        {"main_table.png": main_table_figure(table)},
        url=link(run_id),
    )


# -- rendering ------------------------------------------------------------------------------
def _run_command(section: str) -> str:
    """The command that gives a section its first run."""
    return {"benchmark": "nllab benchmark", "tune": TUNE_EXAMPLE}.get(
        section, f"nllab study {section}"
    )


_CSS = """body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee}.paper{color:#555;font-size:11px}
.flag{color:#a40;font-size:11px}.missing{color:#999}.meta{color:#666;font-size:12px}
caption{caption-side:bottom;color:#666;font-size:12px;text-align:left}"""


def build_report(
    queries: Queries,
    out_dir: str | Path,
    *,
    results: Sequence[CellResult] | None = None,
    profile: str | None = None,
    ui_address: str | None = None,
    force: bool = False,
) -> ReportPaths:
    """Write ``report.html`` (self-contained), ``report.md`` with ``figures/``, and
    ``results.{csv,md,tex}`` of the main table (``results``, trained in ``profile``) to
    ``out_dir`` (see :class:`OwnedFolder`). Only what has run gets a section; one line lists
    the rest, each with the command that runs it."""
    out = OwnedFolder(Path(out_dir), force)
    found = collect_sections(queries, results, ui_address, profile)
    sections = [s for s in found if s.run_id is not None or s.tables]
    not_run = [s for s in found if s not in sections]
    where = f"{queries.settings.tracking_uri} (experiment {queries.settings.experiment})"
    md, body = _report_head(where, [_run_command(s.name) for s in not_run])
    figures: list[Path] = []
    results_paths: list[Path] = []
    for s in sections:
        section_md, section_html, section_figures = _render_section(s, out)
        md += section_md
        body += section_html
        figures += section_figures
    if results is not None:
        texts = results_table(results, profile=str(profile)).texts()
        results_paths = [out.add(f"results.{ext}", text) for ext, text in texts.items()]
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Neural Laplace Lab '
        f"report</title><style>{_CSS}</style></head><body>{''.join(body)}</body></html>"
    )
    html_path = out.add("report.html", page)
    md_path = out.add("report.md", "\n".join(md))
    out.commit()
    return ReportPaths(html_path, md_path, tuple(figures), tuple(results_paths))


#: The verdict's one rule (:func:`tasks.reports.verdict.verdict`); the main table judges the paper
#: profile only (the budget of the paper's figures).
_LEGEND = f"verdict (main table: paper profile only): {VERDICT_RULE}"


def _report_head(where: str, not_run: list[str]) -> tuple[list[str], list[str]]:
    """The title, where the numbers come from, and the commands of the sections not run yet."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    md = [
        "# Neural Laplace Lab: results beside the paper\n",
        f"Generated {stamp} from {where}. {_LEGEND}.\n",
    ]
    body = [
        "<h1>Neural Laplace Lab: results beside the paper</h1>",
        f'<p class="meta">Generated {stamp} from {html.escape(where)}. {_LEGEND}.</p>',
    ]
    if not_run:
        md.append("Not run yet: " + ", ".join(f"`{c}`" for c in not_run) + ".\n")
        body.append(
            '<p class="missing">Not run yet: '
            + ", ".join(f"<code>{html.escape(c)}</code>" for c in not_run)
            + ".</p>"
        )
    return md, body


def _render_section(s: ReportSection, out: OwnedFolder) -> tuple[list[str], list[str], list[Path]]:
    """One section as Markdown lines, HTML fragments and the figure files it added to ``out``."""
    head = f"{s.title} (`{s.name}`) — paper: {s.paper_ref}"
    md = [f"\n## {head}\n"]
    body = [
        f"<h2>{html.escape(s.title)} <code>{html.escape(s.name)}</code></h2>",
        f'<p class="meta">paper: {html.escape(s.paper_ref)}</p>',
    ]
    if s.name != "tune":
        run_md = f"[{s.run_id}]({s.url})" if s.url else str(s.run_id)
        run_html = html.escape(str(s.run_id))
        if s.url:
            run_html = f'<a href="{html.escape(s.url)}">{run_html}</a>'
        md.append(f"profile {s.profile}, parent run {run_md}. {s.notes}\n")
        body.append(
            f'<p class="meta">profile {html.escape(s.profile)}, parent run {run_html}. '
            f"{html.escape(s.notes)}</p>"
        )
    for tname, table in s.tables.items():
        md.append(f"\n**{tname}**\n\n{render_table(table, 'markdown')}")
        body.append(f"<h3>{html.escape(tname)}</h3>{render_table(table, 'html')}")
    figures = []
    for fname, data in s.figures.items():
        name = f"figures/{s.name}__{fname}"
        figures.append(out.add(name, data))
        md.append(f"\n![{s.name} {fname}]({name})\n")
        b64 = base64.b64encode(data).decode("ascii")
        body.append(
            f'<p><img alt="{html.escape(s.name)} {html.escape(fname)}" '
            f'src="data:image/png;base64,{b64}"></p>'
        )
    return md, body, figures
