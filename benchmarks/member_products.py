"""A 1-D pack's matrix–vector products member by member, or batched: seconds per epoch and bytes.

A pack of 1-D systems has matrix–vector products in every step (a last layer with one output,
its weight gradient). Under torch's CPU kernels the engine computes them member by member
(``nltrain``'s per-member split, a ``TorchDispatchMode``: a Python call per operator), since
MKL rounds such a product otherwise in a batch of several than in a batch of one. Under the
portable kernels (the default numerics) each element of a product has one definition whatever
the batch, so the split is off. This script measures what that saves and checks that it changes
no byte: for each model, the ledger's 1-D pack of seed 0 (Mackey–Glass, piecewise forcing,
integro; paper profile, N = 1000, one torch thread) is trained for ``--epochs`` epochs from the
same initial weights with the split off (as the engine runs) and forced on, alternating
``--repeats`` times; it prints the median epoch after the first of each, their ratio, and
whether the trained weights (SHA-256 over every member's tensors) are identical.

    PYTHONPATH=. nice -n 10 python benchmarks/member_products.py --epochs 3 [--record]

``--record`` writes ``results/measurements/member_products.json``
(:func:`tasks.reports.measurements.record_measurement`), rendered on the engine's design page.
Forcing the split on reaches into ``nltrain._member_products``: a benchmark's lever, not an
option of the engine (there the kernels decide).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from ledger_projection import median_epoch, train_pack

from tasks.config import CellConfig
from tasks.engine import make_packs
from tasks.ledger.scope import paper_config
from tasks.pipeline import simulate_data

METHODS = ("nf_coupling", "nf_resnet", "anode", "node")


@contextlib.contextmanager
def split_forced(on: bool) -> Iterator[None]:
    """The per-member split as under torch's kernels (``on``), or as the engine decides."""
    import nltrain._member_products as member_products

    decide = member_products._portable
    if on:
        member_products._portable = lambda: False
    try:
        yield
    finally:
        member_products._portable = decide


def one_d_pack(method: str) -> list[CellConfig]:
    """The engine's pack of seed 0 of ``method`` whose systems are 1-D (the paper profile)."""
    config = paper_config(methods=[method], seeds=[0])
    for pack in make_packs(config.cells(), pack=True):
        dims = {simulate_data(c.system, c.data, c.seed).x.shape[-1] for c in pack}
        if dims == {1} and len(pack) > 1:
            return list(pack)
    raise SystemExit(f"{method}: the engine makes no 1-D pack of several members")


def train_once(cells: Sequence[CellConfig], epochs: int) -> tuple[float, str]:
    """(median seconds per epoch after the first, SHA-256 of the trained weights) of ``cells``
    trained as one pack for ``epochs`` epochs from their seeds' initial weights."""
    models, results, _ = train_pack(cells, epochs, pack=True)
    per_epoch = median_epoch(results[0])
    digest = hashlib.sha256()
    for model in models:
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return per_epoch, digest.hexdigest()


COLUMNS = ("method", "1-D pack", "split off (s/epoch)", "split on (s/epoch)", "on / off", "bytes")


def measure(method: str, epochs: int, repeats: int) -> tuple[str, ...]:
    """One row: ``method``'s 1-D pack timed with the split off and on, alternating."""
    cells = one_d_pack(method)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    digests: set[str] = set()
    for _ in range(repeats):
        for on in (False, True):
            with split_forced(on):
                s, d = train_once(cells, epochs)
            seconds[on].append(s)
            digests.add(d)
    off, on = statistics.median(seconds[False]), statistics.median(seconds[True])
    systems = ", ".join(c.system for c in cells)
    same = "identical" if len(digests) == 1 else f"{len(digests)} different"
    return (method, systems, f"{off:.2f}", f"{on:.2f}", f"{on / off:.2f}", same)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3, help="epochs per training (default 3)")
    ap.add_argument("--repeats", type=int, default=2, help="trainings per mode (default 2)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS[:2]), choices=METHODS)
    ap.add_argument("--record", action="store_true", help="write results/measurements/")
    args = ap.parse_args(argv)
    if args.epochs < 2 or args.repeats < 1:
        ap.error("--epochs must be at least 2 (the first is not timed), --repeats at least 1")
    from nlmodels import portable_cpu_kernels

    if not portable_cpu_kernels():
        raise SystemExit("the portable CPU kernels are not installed: the split is on anyway")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = [measure(m, args.epochs, args.repeats) for m in args.methods]
    note = (
        f"Seed 0, paper profile, one torch thread, {args.epochs} epochs per training, median "
        f"epoch after the first over {args.repeats} trainings per mode, the modes alternating; "
        "bytes: SHA-256 of every member's trained weights over all trainings."
    )
    print(f"| {' | '.join(COLUMNS)} |\n|{'|'.join('---' for _ in COLUMNS)}|")
    for row in rows:
        print(f"| {' | '.join(row)} |")
    print(f"\n{note}\n(measured in {time.perf_counter() - t0:.0f} s)")
    if args.record:
        from tasks.reports.measurements import record_measurement

        command = (
            f"PYTHONPATH=. python benchmarks/member_products.py --epochs {args.epochs} "
            f"--repeats {args.repeats} --methods {' '.join(args.methods)} --record"
        )
        title = "a 1-D pack's matrix–vector products member by member or batched"
        path = record_measurement("member_products", title, command, COLUMNS, rows, note)
        print(f"recorded {path}")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
