"""The pages ``docs/results/studies/NAME.md``: each of the paper's other tables that the results
ledger keeps (:data:`flows.studies.LEDGER_STUDIES`), drawn from the ledger's records by the
study's own body (:func:`flows.studies.recorded_output`): the same table and figures ``nllab
study NAME --profile paper`` would make, beside the paper's figures with the project's one
verdict. ``python -m flows.docs_numbers`` writes each page's block ``study-NAME`` and, beside
the page, its figures (PNG); the block names the digest of the tables the figures are drawn
from, so that ``--check`` finds a figure gone stale without comparing image bytes (which
differ between matplotlib builds).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flows.studies import RecordedOutput
    from tasks.ledger import LedgerStatus

__all__ = ["FIGURES", "study_figures", "study_page"]

#: Where a study's page and figures lie, under the repository's root.
FIGURES = Path("docs") / "results" / "studies"


def _drawn(root: Path, name: str) -> tuple[RecordedOutput, LedgerStatus]:
    """The study drawn from the ledger under ``root``: once per content of the ledger, since its
    page's block and its figures both need it."""
    ledger = root / "results" / "paper" / "ledger.jsonl"
    content = ledger.read_bytes() if ledger.is_file() else b""
    return _drawn_from(ledger, name, hashlib.sha256(content).hexdigest())


@functools.cache
def _drawn_from(ledger: Path, name: str, _content: str) -> tuple[RecordedOutput, LedgerStatus]:
    from flows.ledger.plan import selection_scope
    from flows.studies import recorded_output
    from tasks.ledger import ledger_status, read_ledger

    scope = selection_scope({"studies": (name,)}, ledger=ledger)
    status = ledger_status(read_ledger(ledger, scope), scope.select(studies=(name,)), (name,))
    counted = [s.record for s in status.states if s.state == "recorded" and s.record]
    measurements = ledger.parents[1] / "measurements"
    return recorded_output(name, counted, measurements=measurements), status


def _settings(status: LedgerStatus) -> str:
    """The study's cells in words: systems, methods, seeds and epochs (from the cells)."""
    from flows.studies import planned_cells

    cells = planned_cells(status.studies[0]) if status.studies else []
    if not cells:
        return "no cells"

    def listed(values: list) -> str:
        return ", ".join(map(str, dict.fromkeys(values)))

    epochs = Counter(c.training.epochs for c in cells)
    return (
        f"{len(cells)} cells: systems {listed([c.system for c in cells])}; methods "
        f"{listed([c.method for c in cells])}; seeds {listed(sorted(c.seed for c in cells))}; "
        f"{' or '.join(f'{e} epochs' for e in sorted(epochs))} each, the paper profile's "
        "protocol (the reference code's) otherwise"
    )


def study_page(root: Path, name: str) -> str:
    """The block ``study-NAME``: the study's cells in words, how many the ledger holds, its
    tables from the records and its figures (files beside the page: :func:`study_figures`)."""
    from flows.ledger.study_text import study_lines
    from tasks.reports import VERDICT_RULE, Table, render_table

    drawn, status = _drawn(root, name)
    projected = _projected(root, name)
    cells = (
        f"**Cells.** {_settings(status)}. A cell that is a Table 3 cell (the same config hash) "
        "is Table 3's record; `nllab ledger run --study "
        f"{name}` trains the missing ones and `nllab ledger table --study {name}` prints "
        "this table."
        if status.study_states(name)
        else "**Cells.** None: the table is timed, not trained (a timing is the machine's, "
        "not a model's), so the ledger keeps no cell of it; it is drawn from a committed "
        "measurement that names the hardware (`PYTHONPATH=. python benchmarks/"
        f"study_measurements.py --record --studies {name}` measures it again), and `nllab "
        f"ledger table --study {name}` prints it."
    )
    parts = [
        cells,
        *study_lines(status, root / "results" / "measurements"),
        *([projected] if projected else []),
    ]
    digest = hashlib.sha256()
    for table, frame in drawn.output.tables.items():
        text = render_table(Table.from_frame(frame), "markdown").rstrip()
        digest.update(text.encode())
        parts.append(f"**{table}**\n\n{text}")
    for state in status.states:  # (what a figure draws beyond the tables: the records' curves)
        if state.state == "recorded" and state.record is not None and state.record.curves:
            digest.update(json.dumps(state.record.curves).encode())
    parts.append(
        "The mean over the recorded seeds (value) with their sample std (ddof 1) and number n, "
        "the paper's figure, our mean minus it (gap) and the verdict: "
        f"{VERDICT_RULE}; – where nothing is recorded yet."
    )
    for figure in drawn.figures:
        parts.append(f"![{name}: {figure}]({_figure_name(name, figure)})")
    if drawn.figures:
        drawn_from = digest.hexdigest()[:16]
        parts.append(f"<!-- figures drawn from the tables above: sha256 {drawn_from} -->")
    return "\n\n".join(parts)


def _projected(root: Path, name: str) -> str:
    """The study's row of the projection record (``benchmarks/study_projection.py``), in words."""
    from tasks.reports import read_measurement

    path = root / "results" / "measurements" / "study_projection.json"
    if not path.is_file():
        return ""
    m = read_measurement(path)
    row = next((dict(zip(m.columns, r, strict=True)) for r in m.rows if r[0] == name), None)
    if row is None or "first seed, CPU hours" not in row or row["cells"] == "0":
        return ""  # (nothing to project: a table timed, not trained)
    commit = row.get("projected at") or m.commit  # (a row of its own commit: --keep)
    return (
        f"Projected before it was run, on {m.machine.split(',')[0]} at commit {commit[:10]}: "
        f"{row['CPU hours']} CPU hours for the cells no earlier table trains ("
        f"{row['first seed, CPU hours']} for the first seed), {row['wall hours on 2 cores']} "
        "hours on two cores (`benchmarks/study_projection.py`)."
    )


def _figure_name(study: str, figure: str) -> str:
    return f"{study}-{figure}.png"


def study_figures(root: Path, name: str) -> dict[Path, bytes]:
    """The figures of study ``name``'s page from the records: path (under ``root``) -> PNG."""
    drawn, _ = _drawn(root, name)
    return {FIGURES / _figure_name(name, figure): data for figure, data in drawn.figures.items()}
