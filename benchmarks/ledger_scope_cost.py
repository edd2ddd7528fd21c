"""What a new code state's first ``nllab ledger status`` costs: the ledger's scope (config
hashes and today's numerics fingerprints of every cell, the studies' included) computed with
every cell's canaries, against the same scope with the canaries of the cells the ledger holds
records of alone (:func:`tasks.ledger.ledger_scope`'s ``ledger``), in the same run.

Each computation runs in a fresh process on empty caches (a new ``$NLLAB_HOME`` and installation
cache: every canary it asks for runs), the two alternating ``--repeats`` times; the figure is
the median of each, with the number of distinct configs (config hashes) given numerics.

    PYTHONPATH=. nice -n 10 python benchmarks/ledger_scope_cost.py [--repeats 2] [--record]

``--record`` writes ``results/measurements/ledger_scope_cost.json``
(:func:`tasks.reports.measurements.record_measurement`), rendered on the ledger page.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COLUMNS = ("today's numerics for", "cells", "configs given numerics", "seconds", "ratio")
TITLE = "a new code state's first ledger status"
#: One computation of the status command's scope, in a process of its own.
_CHILD = """
import json, sys
from nlmodels import set_up_numerics
set_up_numerics()
from flows.ledger.plan import selection_scope
ledger = sys.argv[1] or None
scope = selection_scope({"studies": True, "peers": None}, ledger=ledger)
given = {c.config_hash for c in scope.cells if c.numerics is not None}
print(json.dumps([len(scope.cells), len(given)]))
"""


def _once(ledger: Path | None) -> tuple[float, int, int]:
    """Seconds, cells and canaries of one cold computation (``ledger``: None, every cell's)."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "NLLAB_HOME": home, "NLLAB_INSTALL_CACHE": home}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(ledger or "")],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        seconds = time.perf_counter() - t0
    cells, canaries = json.loads(out.strip().splitlines()[-1])
    return seconds, cells, canaries


def measure(ledger: Path, repeats: int) -> list[tuple[str, ...]]:
    """One row per way, the every-cell way first; ratios against it."""
    ways = {"every cell": None, f"the cells {ledger.name} holds records of": ledger}
    seen: dict[str, list[tuple[float, int, int]]] = {w: [] for w in ways}
    for _ in range(repeats):
        for way, path in ways.items():
            seen[way].append(_once(path))
    base = statistics.median(s for s, _, _ in seen["every cell"])
    rows = []
    for way, runs in seen.items():
        seconds = statistics.median(s for s, _, _ in runs)
        _, cells, canaries = runs[-1]
        ratio = f"{seconds / base:.2f}"
        rows.append((way, str(cells), str(canaries), f"{seconds:.1f}", ratio))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    from tasks.ledger import DEFAULT_LEDGER
    from tasks.reports.measurements import show_measurement

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="cold computations of each way")
    ap.add_argument("--ledger", type=Path, default=ROOT / DEFAULT_LEDGER, help="the ledger file")
    ap.add_argument("--record", action="store_true", help="write results/measurements/")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if not args.ledger.is_file():
        ap.error(f"--ledger {args.ledger}: no such file")
    rows = measure(args.ledger, args.repeats)
    command = (
        f"PYTHONPATH=. python benchmarks/ledger_scope_cost.py --repeats {args.repeats} --record"
    )
    show_measurement(
        COLUMNS,
        rows,
        f"The scope of `nllab ledger status` (Table 3, the ablation, the peers and the studies, "
        f"under the paper profile), each computed cold in a fresh process: median of "
        f"{args.repeats}, the two alternating; wall seconds from the process's start (imports "
        f"included).",
        record=("ledger_scope_cost", TITLE, command) if args.record else None,
    )


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # (the children compute; this process only reads the ledger)
    main()
