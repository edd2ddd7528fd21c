"""What the numerics canaries cost: each model canary of the paper profile, at the sizes that reach
every branch of the native kernels, against the earlier small canary, in the same run.

A model's fingerprint (:mod:`nltrain.numerics._fingerprints`) is its canary training's bytes,
computed once per source state, model settings and state dimension, so after an edit of ``nltrain``,
``nlmodels`` or ``datasets`` every command that trains pays for the canaries of the models it
uses before its first cell. The canary grew from 8 training trajectories in batches of 4 (which
left the kernels' 32-column blocks and some row blocks unrun) to 45 in batches of 37 and one
per state dimension; this script times both for each (model, settings, state dimension) of the
paper profile and its ablation (one torch thread, median of ``--repeats``, the two alternating)
and prints their ratio, then the whole cold start of the ledger's fingerprints (every model and
system canary, as ``nllab ledger status`` computes them after an edit) and a warm one (read
from the cache).

    PYTHONPATH=. nice -n 10 python benchmarks/fingerprint_cost.py [--repeats 3] [--record]

``--record`` writes ``results/measurements/fingerprint_cost.json``
(:func:`tasks.reports.measurements.record_measurement`), rendered in the measurements page.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

COLUMNS = ("model", "settings", "state dim", "small canary (s)", "today's canary (s)", "ratio")
#: The canary's sizes before it covered the kernels' blocks: 8 training trajectories, 4
#: validation ones, batches of 4.
SMALL = (8, 4, 4)


@contextlib.contextmanager
def sizes(train: int, val: int, batch: int) -> Iterator[None]:
    """The canary at other sizes (a benchmark's lever, not an option of the fingerprints)."""
    from nltrain.numerics import _fingerprints as fp

    before = fp._CANARY_TRAIN, fp._CANARY_VAL, fp._CANARY_BATCH
    fp._CANARY_TRAIN, fp._CANARY_VAL, fp._CANARY_BATCH = train, val, batch
    try:
        yield
    finally:
        fp._CANARY_TRAIN, fp._CANARY_VAL, fp._CANARY_BATCH = before


def _seconds(key: tuple[str, str, int, str]) -> float:
    from nltrain.numerics import _fingerprints as fp

    method, settings, dim, protocol = key
    t0 = time.perf_counter()
    fp._train_canary(method, hashlib.sha256(), json.loads(settings), dim, json.loads(protocol))
    return time.perf_counter() - t0


def measure(repeats: int) -> tuple[list[tuple[str, ...]], int, float, float]:
    """Rows per canary, the number of system canaries, and the cold and warm seconds of every
    fingerprint of the paper cells."""
    from tasks.ledger.scope import ledger_cell_configs
    from tasks.machine import numerics

    cells = [cell for cell, _ in ledger_cell_configs(seeds=[0])]
    keys = sorted({numerics.model_key(c) for c in cells})
    rows = []
    for key in keys:
        small, today = [], []
        for _ in range(repeats):
            with sizes(*SMALL):
                small.append(_seconds(key))
            today.append(_seconds(key))
        a, b = statistics.median(small), statistics.median(today)
        settings = ", ".join(f"{k}={v}" for k, v in json.loads(key[1]).items()) or "defaults"
        rows.append((key[0], settings, str(key[2]), f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}"))
    with tempfile.TemporaryDirectory() as home:
        os.environ["NLLAB_HOME"] = home  # empty caches: every canary runs
        os.environ["NLLAB_INSTALL_CACHE"] = home  # (the installation's too)
        from nltrain.numerics import _fingerprints as fp

        fp._MEMO.clear()
        t0 = time.perf_counter()
        numerics.warm(cells)
        cold = time.perf_counter() - t0
        fp._MEMO.clear()
        t0 = time.perf_counter()
        numerics.warm(cells)
        warm = time.perf_counter() - t0
    return rows, len({numerics.system_key(c) for c in cells}), cold, warm


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="timings per canary and size")
    ap.add_argument("--record", action="store_true", help="write results/measurements/")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    torch.set_num_threads(1)
    rows, systems, cold, warm = measure(args.repeats)
    note = (
        f"One torch thread, median of {args.repeats} per canary, the two sizes alternating "
        f"(small: {SMALL[0]} training and {SMALL[1]} validation trajectories in batches of "
        f"{SMALL[2]}). Every fingerprint of the paper profile's and its ablation's cells "
        f"({len(rows)} model canaries and {systems} system canaries): {cold:.1f} s with an empty "
        f"cache, {warm:.2f} s read from it."
    )
    from tasks.reports.measurements import show_measurement

    script = "PYTHONPATH=. python benchmarks/fingerprint_cost.py"
    command = f"{script} --repeats {args.repeats} --record"
    title = "what the numerics canaries cost"
    record = ("fingerprint_cost", title, command) if args.record else None
    show_measurement(COLUMNS, rows, note, record=record)


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the canaries train
    main()
