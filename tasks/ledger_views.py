"""What ``nllab ledger`` prints: the status grid and Table 3 from the ledger's records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tasks.ledger import CellState, LedgerRecord, cell_states, current_records, ledger_table
from tasks.tables import Table, TableCell, render_table

if TYPE_CHECKING:
    from tasks.config import CellConfig

__all__ = ["ledger_markdown", "ledger_terminal", "status_report"]

_STATE_WORDS = {
    "recorded": "recorded",
    "missing": "missing",
    "other_config": "recorded under another config only",
    "other_numerics": "recorded by older numerics",
}


def _ordered(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _grid(states: Sequence[CellState]) -> Table:
    """Methods × systems: recorded seeds of the selected ones, and which are missing."""
    methods = _ordered([s.method for s in states])
    systems = _ordered([s.system for s in states])
    rows = []
    for m in methods:
        cells = []
        for sy in systems:
            mine = [s for s in states if s.method == m and s.system == sy]
            done = sum(s.state == "recorded" for s in mine)
            cells.append(
                TableCell(f"{done}/{len(mine)}", verdict="match" if done == len(mine) else "")
            )
        rows.append((TableCell(m), *cells))
    return Table(
        ("method", *systems), tuple(rows), "Seeds recorded at today's config, of those selected."
    )


def status_report(
    records: Sequence[LedgerRecord],
    cells: Sequence[CellConfig],
    where: str,
    numerics: Callable[[CellConfig], str | None] | None = None,
) -> str:
    """Counts by state, the methods × systems grid, and the cells not counted with why."""
    states = cell_states(records, cells, numerics)
    counts = Counter(s.state for s in states)
    lines = [
        f"{where}: {len(records)} records; of the {len(states)} selected cells of the paper "
        f"profile, {counts['recorded']} recorded, {counts['missing']} missing, "
        f"{counts['other_config']} recorded under another config only, "
        f"{counts['other_numerics']} recorded by older numerics ("
        f"{sum(s.state == 'recorded' and s.record.numerics is None for s in states)} of the "
        "recorded ones predate numerics fingerprints: their commit says what they ran)",
        "",
        render_table(_grid(states), "terminal", width=140),
    ]
    for m in _ordered([s.method for s in states]):
        todo = [s for s in states if s.method == m and s.state != "recorded"]
        if todo:
            by_system: dict[str, list[str]] = {}
            for s in todo:
                by_system.setdefault(s.system, []).append(str(s.seed))
            needs = "; ".join(f"{sy} {','.join(seeds)}" for sy, seeds in by_system.items())
            lines.append(f"{m} needs {len(todo)}: {needs}")
    stale = [s for s in states if s.state in ("other_config", "other_numerics")]
    for s in stale:
        r = s.record
        lines.append(
            f"{s.system}/{s.method}/seed{s.seed}: {_STATE_WORDS[s.state]} "
            f"(config {r.config_hash[:12]}, commit {(r.commit or 'unknown')[:12]})"
        )
    return "\n".join(lines)


def _hardware(records: Sequence[LedgerRecord]) -> str:
    made = Counter(f"{r.device or '?'} ({r.hardware or 'unknown'})" for r in records)
    return "; ".join(f"{n} on {what}" for what, n in sorted(made.items()))


def _table(records: Sequence[LedgerRecord], cells: Sequence[CellConfig]) -> tuple[Table, str]:
    current = current_records(records, cells)
    table = ledger_table(current, cells).main_table(seeds=True)
    note = (
        f"{len(current)} of the {len(cells)} selected cells recorded. Made by: "
        f"{_hardware(current) or 'nothing yet'}."
    )
    return table, note


def ledger_markdown(records: Sequence[LedgerRecord], cells: Sequence[CellConfig]) -> str:
    """Table 3 from the records under today's config, as Markdown, with what made them."""
    table, note = _table(records, cells)
    return render_table(table, "markdown") + "\n\n" + note


def ledger_terminal(records: Sequence[LedgerRecord], cells: Sequence[CellConfig]) -> str:
    table, note = _table(records, cells)
    return render_table(table, "terminal", width=160) + "\n" + note
