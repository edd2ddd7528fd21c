"""``nllab report`` for issue 6: one self-contained HTML report (figures embedded as base64 PNG)
and a Markdown report gathering every table and figure of the latest study and benchmark runs,
read from MLflow through the :class:`~tasks.tracking.Tracker`.

Every study table carries the paper's figure beside ours (``paper``), the difference (``gap``)
and a ``verdict`` (better / match within 10 % / worse), marked ▲ / ✓ / ▼ and coloured in HTML.
"""

from __future__ import annotations

import base64
import html
import json
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

import tasks._env  # noqa: F401
from tasks.tracking import Tracker

__all__ = ["ReportPaths", "ReportSection", "build_report", "collect_sections"]

_MARK = {"better": "▲ better", "match": "✓ match", "worse": "▼ worse"}
_COLOUR = {"better": "#d4f4d4", "match": "#dbe9ff", "worse": "#ffd9d9"}


@dataclass(frozen=True)
class ReportSection:
    """One study (or the benchmark) as found in the store."""

    name: str
    title: str
    paper_ref: str
    run_id: str | None
    profile: str
    tables: dict[str, pd.DataFrame]
    figures: dict[str, bytes]
    notes: str = ""
    markdown: str = ""  # a ready-made Markdown table (the benchmark's results.md)


@dataclass(frozen=True)
class ReportPaths:
    html: Path
    markdown: Path
    figures: tuple[Path, ...]


def _study_section(tracker: Tracker, name: str, title: str, paper_ref: str) -> ReportSection:
    run_id = tracker.latest_run(f"study:{name}")
    if run_id is None:
        return ReportSection(name, title, paper_ref, None, "–", {}, {})
    with tempfile.TemporaryDirectory(prefix="nllab-report-") as tmp:
        root = tracker.download(run_id, "study", tmp)
        meta = (
            json.loads((root / "study.json").read_text()) if (root / "study.json").exists() else {}
        )
        tables = {p.stem: pd.read_csv(p) for p in sorted((root / "tables").glob("*.csv"))}
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
    )


def _benchmark_section(tracker: Tracker) -> ReportSection:
    title, ref = "Main table", "Table 3 (Table:MainMSE)"
    run_id = tracker.latest_run("benchmark")
    if run_id is None:
        return ReportSection("benchmark", title, ref, None, "–", {}, {})
    profile = tracker.get_run_data(run_id).data.tags.get("profile", "?")
    with tempfile.TemporaryDirectory(prefix="nllab-report-") as tmp:
        root = tracker.download(run_id, "results", tmp)
        md = (root / "results.md").read_text() if (root / "results.md").exists() else ""
        tables = (
            {"results": pd.read_csv(root / "results.csv")}
            if (root / "results.csv").exists()
            else {}
        )
    if "results" in tables:
        t = tables["results"]
        t["gap"] = t["mean"] - t["paper_mean"]
        t["verdict"] = [
            _verdict_band(m, s, pm, ps)
            for m, s, pm, ps in zip(
                t["mean"], t["std"], t["paper_mean"], t["paper_std"], strict=True
            )
        ]
    return ReportSection("benchmark", title, ref, run_id, profile, tables, {}, markdown=md)


def _verdict_band(mean: float, std: float, paper: float, paper_std: float) -> str:
    """Main table: a match is within the paper's ± band (plus ours)."""
    if not (np.isfinite(mean) and np.isfinite(paper)):
        return "–"
    band = (paper_std if np.isfinite(paper_std) else 0.0) + (std if np.isfinite(std) else 0.0)
    if abs(mean - paper) <= band:
        return "match"
    return "better" if mean < paper else "worse"


def collect_sections(tracker: Tracker) -> list[ReportSection]:
    """The benchmark and every registered study, latest parent run each (missing ones empty)."""
    from flows.studies import STUDIES

    sections = [_benchmark_section(tracker)]
    for name, study in STUDIES.items():
        sections.append(_study_section(tracker, name, study.spec.title, study.spec.paper_ref))
    return sections


# -- rendering ------------------------------------------------------------------------------
def _fmt(v) -> str:
    if isinstance(v, float | np.floating):
        return "–" if not np.isfinite(v) else f"{v:.4g}"
    return str(v)


def _md_table(frame: pd.DataFrame) -> str:
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in frame.iterrows():
        cells = [
            _MARK.get(str(row[c]), _fmt(row[c])) if c == "verdict" else _fmt(row[c]) for c in cols
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _html_table(frame: pd.DataFrame) -> str:
    cols = list(frame.columns)
    out = ["<table><thead><tr>"]
    out += [f"<th>{html.escape(c)}</th>" for c in cols]
    out.append("</tr></thead><tbody>")
    for _, row in frame.iterrows():
        verdict = str(row.get("verdict", ""))
        style = f' style="background:{_COLOUR[verdict]}"' if verdict in _COLOUR else ""
        out.append(f"<tr{style}>")
        for c in cols:
            text = _MARK.get(verdict, verdict) if c == "verdict" else _fmt(row[c])
            out.append(f"<td>{html.escape(text)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


_CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f2f2f2}
td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}
.missing{color:#999}.meta{color:#666;font-size:12px}"""


def build_report(tracker: Tracker, out_dir: str | Path) -> ReportPaths:
    """Write ``report.html`` (self-contained) and ``report.md`` (+ ``figures/``) to ``out_dir``."""
    out = Path(out_dir)
    fig_dir = out / "figures"
    if fig_dir.exists():
        shutil.rmtree(fig_dir)
    fig_dir.mkdir(parents=True)
    sections = collect_sections(tracker)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    legend = "verdict: ▲ better than the paper, ✓ within 10 % (main table: within ± band), ▼ worse"
    md = [
        "# Neural Laplace Lab: results beside the paper\n",
        f"Generated {stamp} from {tracker.settings.tracking_uri} "
        f"(experiment {tracker.settings.experiment}). {legend}.\n",
    ]
    body = [
        "<h1>Neural Laplace Lab: results beside the paper</h1>",
        f'<p class="meta">Generated {stamp} from {html.escape(tracker.settings.tracking_uri)} '
        f"(experiment {html.escape(tracker.settings.experiment)}). {legend}.</p>",
    ]
    figures: list[Path] = []
    for s in sections:
        head = f"{s.title} (`{s.name}`) — paper: {s.paper_ref}"
        md.append(f"\n## {head}\n")
        body.append(f"<h2>{html.escape(s.title)} <code>{html.escape(s.name)}</code></h2>")
        body.append(f'<p class="meta">paper: {html.escape(s.paper_ref)}</p>')
        if s.run_id is None:
            cmd = "nllab benchmark" if s.name == "benchmark" else f"nllab study {s.name}"
            md.append(f"_No run yet: `{cmd}`._\n")
            body.append(f'<p class="missing">No run yet: <code>{html.escape(cmd)}</code></p>')
            continue
        meta = f"profile {s.profile}, parent run {s.run_id}"
        md.append(f"{meta}. {s.notes}\n")
        body.append(f'<p class="meta">{html.escape(meta)}. {html.escape(s.notes)}</p>')
        if s.markdown:
            md.append(s.markdown)
        for tname, frame in s.tables.items():
            if not s.markdown:
                md.append(f"\n**{tname}**\n\n{_md_table(frame)}")
            body.append(f"<h3>{html.escape(tname)}</h3>{_html_table(frame)}")
        for fname, data in s.figures.items():
            path = fig_dir / f"{s.name}__{fname}"
            path.write_bytes(data)
            figures.append(path)
            md.append(f"\n![{s.name} {fname}](figures/{path.name})\n")
            b64 = base64.b64encode(data).decode("ascii")
            body.append(
                f'<p><img alt="{html.escape(fname)}" src="data:image/png;base64,{b64}"></p>'
            )
    page = (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>Neural Laplace Lab report'
        f"</title><style>{_CSS}</style></head><body>{''.join(body)}</body></html>"
    )
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(page, encoding="utf-8")
    md_path.write_text("\n".join(md), encoding="utf-8")
    return ReportPaths(html_path, md_path, tuple(figures))
