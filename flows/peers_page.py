"""The page ``docs/results/laplace_peers.md``: the Laplace-domain learners (Laplace-Net, the
Laplace Neural Operator, the neural DDE; :data:`tasks.ledger.scope.PEERS`) beside Neural Laplace
on its suite, from the records: the results ledger at the paper's budget
(:mod:`tasks.ledger.peers`) and the recorded quick run. ``python -m flows.docs_numbers`` writes
it as the block ``laplace-peers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.ledger import LedgerRecord, LedgerScope
    from tasks.ledger.quick_record import QuickRun

__all__ = ["laplace_peers", "peers_markdown"]


def _budget() -> str:
    """The paper profile's budget in words, from its profile file."""
    from tasks.ledger import paper_config

    config = paper_config()
    t = config.training
    patience = f"patience {t.patience}" if t.patience is not None else "no early stopping"
    return (
        f"{len(config.seeds)} seeds of {t.epochs} epochs each, {patience}, on "
        f"{config.data.n_trajectories} trajectories per system"
    )


def _quick(run: QuickRun, methods: Sequence[str]) -> str:
    """The quick run's cells of ``methods``: systems × methods, test RMSE of its one seed."""
    from tasks.config.names import model_label
    from tasks.reports import Table, TableCell, number, render_table

    rmse = {(c.system, c.method): c.test_rmse for c in run.cells}
    epochs = {c.method: c.epochs for c in run.cells if c.epochs is not None}
    systems = list(dict.fromkeys(c.system for c in run.cells))
    rows = tuple(
        (
            TableCell(system),
            *(
                TableCell(number(rmse[(system, m)]) if (system, m) in rmse else "–")
                for m in methods
            ),
        )
        for system in systems
    )
    header = ("system", *(f"{model_label(m)} ({epochs.get(m, '–')} epochs)" for m in methods))
    caption = (
        f"The quick profile (seed {', '.join(sorted({str(c.seed) for c in run.cells}))}, a fixed "
        "number of epochs per model for about equal training time), test RMSE, from "
        f"`results/quick/{run.profile}.json` (recorded {run.date} on {run.machine})."
    )
    return render_table(Table(header, rows, caption), "markdown")


def peers_markdown(
    records: Sequence[LedgerRecord],
    scope: LedgerScope,
    quick: QuickRun | None,
    budget: str,
) -> str:
    """The page's text: the protocol, the ledger's table of the peers beside Neural Laplace
    (:func:`tasks.ledger.peers.peers_table`) with its count of recorded cells, and the quick
    run's cells of the same models (``quick``, None: not recorded). ``budget``: the paper
    profile's, in words."""
    from tasks.ledger import PEERS, ledger_status
    from tasks.ledger.peers import CONTEXT, peers_count, peers_table
    from tasks.reports import render_table

    status = ledger_status(records, scope.select(ablations=False, peers=None))
    protocol = (
        f"**Protocol.** Every cell trains at the paper's budget ({budget}). The peers have no "
        "protocol of the paper's reference code, so `--profile paper` and `--profile fair` "
        "configure each of their cells alike: one record serves both, as Neural Laplace's "
        "does. The Neural Laplace column and the best baseline are Table 3's cells under the "
        "reference protocol (`--profile paper`); Neural Laplace's cells are the same under "
        "both. A cell shows the mean ± sample std (ddof 1) over its recorded seeds and their "
        "number n; *not recorded yet* marks a cell the ledger does not hold: `nllab ledger "
        "run` trains the peers after Table 3, the ablation and the paper's other tables, seed 0 "
        "first, then the rest."
    )
    parts = [
        protocol,
        render_table(peers_table(status), "markdown").rstrip(),
        f"{peers_count(status)} `nllab ledger status --peers` lists them; `nllab ledger table "
        "--peers` prints this table.",
    ]
    if quick is not None and any(c.method in PEERS for c in quick.cells):
        parts.append(_quick(quick, (CONTEXT, *PEERS)))
    else:
        parts.append("No quick run with the peers is recorded yet.")
    return "\n\n".join(parts)


def laplace_peers(root: Path) -> str:
    """The Laplace-domain peers beside Neural Laplace per system, from the ledger and the quick
    record (the page ``docs/results/laplace_peers.md``)."""
    from tasks.ledger import ledger_scope, read_ledger, read_quick_run

    ledger = root / "results" / "paper" / "ledger.jsonl"
    scope = ledger_scope(ledger=ledger)
    records = read_ledger(ledger, scope)
    path = root / "results" / "quick" / "quick.json"
    quick = read_quick_run(path) if path.is_file() else None
    return peers_markdown(records, scope, quick, _budget())
