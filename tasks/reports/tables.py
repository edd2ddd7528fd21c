"""Report tables: one table model (:class:`Table` of :class:`TableCell`) and its four renderers
(:func:`render_table`: terminal, Markdown, LaTeX, HTML), and the verdict of ours against the
paper's figure (:func:`tasks.reports.verdict.verdict`) marked ▲ ✓ ▼."""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from tasks.reports.verdict import Verdict, is_verdict

if TYPE_CHECKING:  # pandas loads only where a frame is given (nllab artifacts has none)
    import pandas as pd

__all__ = [
    "NOT_IN_PAPER",
    "VERDICT_COLOURS",
    "VERDICT_MARKS",
    "Format",
    "Table",
    "TableCell",
    "Verdict",
    "number",
    "plural",
    "render_table",
]


def number(value: float | np.floating | None) -> str:
    """The one number format of every table and summary line: 4 significant digits (0.1126,
    0.00085, 12.35), ``–`` for a missing or non-finite value."""
    if value is None or not np.isfinite(value):
        return "–"
    return f"{float(value):.4g}"


def plural(n: int, noun: str) -> str:
    """``1 cell``, ``2 cells``: a count and its noun, plural unless one."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


# -- one table model, four renderers ---------------------------------------------------------------
Format = Literal["terminal", "markdown", "latex", "html"]

VERDICT_MARKS = {"better": "▲", "match": "✓", "worse": "▼", "unclear": "?"}
VERDICT_COLOURS = {
    "better": "#d4f4d4",
    "match": "#dbe9ff",
    "worse": "#ffd9d9",
    "unclear": "#eeeeee",
}
_ANSI = {"better": "\x1b[32m", "match": "\x1b[34m", "worse": "\x1b[31m", "unclear": "\x1b[33m"}
_LATEX_MARKS = {
    "better": r"$\blacktriangle$",
    "match": r"$\checkmark$",
    "worse": r"$\blacktriangledown$",
    "unclear": "?",
}


@dataclass(frozen=True)
class TableCell:
    """One cell: our value, the paper's beside it, the best-of-column mark, the verdict colour,
    a link (an MLflow run) and a warning flag."""

    text: str
    paper: str = ""
    best: bool = False
    verdict: Verdict = ""
    link: str | None = None
    flag: str = ""
    mark: bool = True  # append the verdict's mark (off when the text already names it)

    @classmethod
    def of(cls, value: object) -> TableCell:
        if isinstance(value, TableCell):
            return value
        if isinstance(value, float | np.floating):
            return cls(number(value))
        return cls(str(value))


@dataclass(frozen=True)
class Table:
    """Rows of :class:`TableCell` under a header; the first ``keys`` columns label the rows
    (a terminal table too wide for one block repeats them in each)."""

    header: tuple[str, ...]
    rows: tuple[tuple[TableCell, ...], ...]
    caption: str = ""
    keys: int = 1

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, caption: str = "") -> Table:
        """A data frame as a table; a ``verdict`` column colours its row's cells."""
        cols = list(frame.columns)
        rows = []
        for _, r in frame.iterrows():
            shown = str(r["verdict"]) if "verdict" in cols else ""
            v: Verdict = shown if is_verdict(shown) else ""
            cells = []
            for c in cols:
                if c == "verdict":
                    text = f"{VERDICT_MARKS[v]} {v}" if v else "–"
                    cells.append(TableCell(text, verdict=v, mark=False))
                else:
                    cells.append(TableCell.of(r[c]))
            rows.append(tuple(cells))
        return cls(tuple(cols), tuple(rows), caption)


def _esc_latex(s: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("_", r"\_"),
        ("%", r"\%"),
        ("&", r"\&"),
        ("#", r"\#"),
    ):
        s = s.replace(a, b)
    return s.replace("±", r"$\pm$")


#: The paper figure of a model of the project that the paper does not run (no "paper" before it).
NOT_IN_PAPER = "not in the paper"


def _paper_words(paper: str) -> str:
    return paper if paper == NOT_IN_PAPER else f"paper {paper}"


def _cell_markdown(c: TableCell) -> str:
    text = f"[{c.text}]({c.link})" if c.link else c.text
    if c.best:
        text = f"**{text}**"
    if c.verdict and c.mark:
        text += f" {VERDICT_MARKS[c.verdict]}"
    if c.paper:
        text += f" ({_paper_words(c.paper)})"
    if c.flag:
        text += f" ⚠ {c.flag}"
    return text.replace("|", "\\|")


def _cell_latex(c: TableCell) -> str:
    text = _esc_latex(c.text)
    if c.best:
        text = rf"\textbf{{{text}}}"
    if c.verdict and c.mark:
        text += " " + _LATEX_MARKS[c.verdict]
    if c.paper:
        text += rf" {{\scriptsize ({_esc_latex(c.paper)})}}"
    if c.flag:
        text += rf"$^\dagger${{\scriptsize {_esc_latex(c.flag)}}}"
    return text


def _cell_html(c: TableCell) -> str:
    text = html.escape(c.text)
    if c.link:
        text = f'<a href="{html.escape(c.link)}">{text}</a>'
    if c.best:
        text = f"<b>{text}</b>"
    if c.verdict and c.mark:
        text += f' <span class="mark">{VERDICT_MARKS[c.verdict]}</span>'
    if c.paper:
        text += f'<br><span class="paper">{html.escape(_paper_words(c.paper))}</span>'
    if c.flag:
        text += f'<br><span class="flag">⚠ {html.escape(c.flag)}</span>'
    style = f' style="background:{VERDICT_COLOURS[c.verdict]}"' if c.verdict else ""
    cls = ' class="best"' if c.best else ""
    return f"<td{cls}{style}>{text}</td>"


def _cell_lines(c: TableCell) -> list[str]:
    marks = (f" {VERDICT_MARKS[c.verdict]}" if c.verdict and c.mark else "") + (
        " ⚠" if c.flag else ""
    )
    lines = [("*" if c.best else "") + c.text + marks]
    if c.paper:
        lines.append(f"({c.paper})")
    return lines


def _terminal(t: Table, width: int, color: bool) -> str:
    """Columns split into blocks (the row labels, the first ``t.keys`` columns, repeated) so no
    line exceeds ``width``."""
    cells = [[_cell_lines(c) for c in row] for row in t.rows]
    ncol = len(t.header)
    keys = list(range(max(1, min(t.keys, ncol))))
    widths = [
        max([len(t.header[j])] + [len(line) for row in cells for line in row[j]])
        for j in range(ncol)
    ]
    widths[0] = min(widths[0], width // 3)
    label_w = sum(widths[j] + 2 for j in keys) - 2
    widths = [w if j in keys else min(w, width - label_w - 2) for j, w in enumerate(widths)]
    blocks: list[list[int]] = [[]]
    used = label_w
    for j in range(len(keys), ncol):
        if blocks[-1] and used + 2 + widths[j] > width:
            blocks.append([])
            used = label_w
        blocks[-1].append(j)
        used += 2 + widths[j]

    def fit(s: str, w: int) -> str:
        return s if len(s) <= w else s[: w - 1] + "…"

    out: list[str] = []
    for cols in blocks:
        idx = [*keys, *cols]
        head = "  ".join(fit(t.header[j], widths[j]).ljust(widths[j]) for j in idx)
        out += [head.rstrip(), "  ".join("─" * widths[j] for j in idx)]
        for r, row in enumerate(t.rows):
            height = max(len(cells[r][j]) for j in idx)
            for k in range(height):
                parts = []
                for j in idx:
                    w = widths[j]
                    lines = cells[r][j]
                    text = fit(lines[k], w).ljust(w) if k < len(lines) else " " * w
                    if color and row[j].verdict and k == 0:
                        text = f"{_ANSI[row[j].verdict]}{text}\x1b[0m"
                    parts.append(text)
                out.append("  ".join(parts).rstrip())
        out.append("")
    for row in t.rows:  # flags as footnotes: "⚠ row / column: why"
        for j, c in enumerate(row):
            if c.flag:
                note = f"⚠ {' / '.join(row[k].text for k in keys)} / {t.header[j]}: {c.flag}"
                out += textwrap.wrap(note, width, subsequent_indent="  ")
    if t.caption:
        out += textwrap.wrap(t.caption, width)
    return "\n".join(out).rstrip() + "\n"


def render_table(table: Table, fmt: Format, *, width: int = 100, color: bool = False) -> str:
    """The one renderer of every report table: a terminal text of at most ``width`` columns
    (``color``: ANSI verdict colours), GitHub Markdown, a LaTeX ``tabular`` (booktabs) or an
    HTML ``<table>``. Best cells are bold (``*`` in the terminal), verdicts marked ▲ ✓ ▼."""
    if fmt == "terminal":
        return _terminal(table, width, color)
    if fmt == "markdown":
        lines = ["| " + " | ".join(table.header) + " |", "|" + "---|" * len(table.header)]
        lines += ["| " + " | ".join(_cell_markdown(c) for c in row) + " |" for row in table.rows]
        return "\n".join(lines) + "\n" + (f"\n{table.caption}\n" if table.caption else "")
    if fmt == "latex":
        lines = [
            rf"\begin{{tabular}}{{l{'c' * (len(table.header) - 1)}}}",
            r"\toprule",
            " & ".join(_esc_latex(h) for h in table.header) + r" \\",
            r"\midrule",
        ]
        lines += [" & ".join(_cell_latex(c) for c in row) + r" \\" for row in table.rows]
        lines += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(lines) + "\n"
    if fmt == "html":
        head = "".join(f"<th>{html.escape(h)}</th>" for h in table.header)
        body = "".join("<tr>" + "".join(_cell_html(c) for c in row) + "</tr>" for row in table.rows)
        cap = f"<caption>{html.escape(table.caption)}</caption>" if table.caption else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    raise ValueError(f"unknown table format {fmt!r}; valid: terminal, markdown, latex, html")
