"""Training throughput per model: one cell at a time against seeds packed into one model.

For each model, on data of the paper profile's shapes (800 training and 100 validation
trajectories of 2 dimensions, 100 observed and 100 predicted points, batch 128, float64, Adam with
clipping at 1), it times

* eager: ``tasks.training.train`` of one cell;
* packed: ``tasks.packing.train_packed`` of ``--members`` cells (seeds 0, 1, ...) trained as one
  batched model; its time per cell-epoch is the packed epoch time divided by the members;
* graphs (CUDA only): the packed step replayed from a captured CUDA graph;

all in the same process, and prints a Markdown table with cells per hour (per worker, at
``--epochs-run`` epochs a cell), the speed-up of packing, and the projected hours of the paper
profile (180 cells = 6 systems × 6 models × 5 seeds) with ``--workers`` parallel workers, at the
1000-epoch upper bound and at ``--epochs-run`` epochs (early stopping ends most cells sooner).
Models that are not packable train one by one in ``train_packed``: their packed time is eager's.

    PYTHONPATH=. python benchmarks/throughput.py --device cpu --epochs 2 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasets import SplitData
from nlmodels import build_model
from nlmodels.diagnostics import trajectories
from tasks.config import METHODS, TrainConfig
from tasks.packing import packable, train_packed
from tasks.training import seeded, select_device, train

PAPER_CELLS_PER_MODEL = 6 * 5  # systems × seeds
N_TRAIN, N_VAL = 800, 100


def splits() -> tuple[SplitData, SplitData]:
    t, x = trajectories(N_TRAIN + N_VAL, seed=0)
    t, x = t.numpy(), x.numpy()
    half = t.shape[0] // 2

    def split(rows: slice) -> SplitData:
        xs = x[rows]
        return SplitData(
            obs_t=t[:half],
            obs_x=xs[:, :half],
            query_t=t[half:],
            target=xs[:, half:],
            target_clean=xs[:, half:],
            index=np.arange(xs.shape[0]),
            ic=xs[:, 0],
        )

    return split(slice(0, N_TRAIN)), split(slice(N_TRAIN, None))


def models(name: str, seeds: range):
    out = []
    for s in seeds:
        with seeded(s):
            out.append(build_model(name, 2))
    return out


def per_epoch(history) -> float:
    # the median skips a first epoch's one-off costs when there are several
    return statistics.median(r.seconds for r in history)


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def packed_seconds(name, tr, va, cfg, device, members: int, graphs: bool | None) -> float | None:
    """Seconds per cell-epoch of ``members`` seeds packed (None: no graph was captured)."""
    results = train_packed(
        models(name, range(members)),
        [tr] * members,
        [va] * members,
        cfg,
        device=device,
        seeds=list(range(members)),
        graphs=graphs,
    )
    if graphs is None and not results[0].graphs:
        return None
    return per_epoch(results[0].history) / members


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--members", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2, help="epochs timed per run")
    ap.add_argument("--epochs-run", type=int, default=400, help="epochs a cell is assumed to run")
    ap.add_argument("--workers", type=int, default=2, help="parallel workers of the projection")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (per worker)")
    ap.add_argument("--models", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument(
        "--repeats", type=int, default=1, help="alternate eager and packed runs; keep the fastest"
    )
    args = ap.parse_args()
    if args.members < 2:
        ap.error("--members must be >= 2")
    torch.set_num_threads(args.threads)
    device = select_device(args.device)
    tr, va = splits()
    cfg = TrainConfig(epochs=args.epochs, patience=None, batch_size=128)
    print(
        f"device {device}, {args.threads} thread(s), {args.epochs} epochs timed, "
        f"{N_TRAIN} train / {N_VAL} val trajectories, 100 + 100 points, D = 2, batch 128, "
        f"float64, torch {torch.__version__}\n"
    )
    rows = []
    for name in args.models:
        can_pack = packable(models(name, range(1))[0], device)
        eager = packed = graphs = None
        for _ in range(args.repeats):  # alternating, so that a busy machine slows all alike
            (one,) = models(name, range(1))
            eager = _min(eager, per_epoch(train(one, tr, va, cfg, seed=0).history))
            if not can_pack:
                continue
            packed = _min(packed, packed_seconds(name, tr, va, cfg, device, args.members, False))
            if device.type == "cuda":
                graphs = _min(graphs, packed_seconds(name, tr, va, cfg, device, args.members, None))
        rows.append((name, eager, packed, graphs))
        print(f"  {name}: eager {eager}, packed {packed}, graphs {graphs} s/cell-epoch", flush=True)

    best = {n: min(v for v in (e, p, g) if v is not None) for n, e, p, g in rows}
    print(
        f"\n| model | eager s/cell-epoch | packed ×{args.members} s/cell-epoch "
        "| graphs s/cell-epoch | packed speed-up | cells/h/worker eager | cells/h/worker best |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, eager, packed, graphs in rows:
        fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
        speed = "not packable" if packed is None else f"{eager / packed:.2f}×"
        per_cell = args.epochs_run
        print(
            f"| {name} | {eager:.3f} | {fmt(packed)} | {fmt(graphs)} | {speed} "
            f"| {3600 / (eager * per_cell):.2f} | {3600 / (best[name] * per_cell):.2f} |"
        )

    def hours(epochs: int, per: dict[str, float]) -> float:
        cell_seconds = sum(PAPER_CELLS_PER_MODEL * epochs * per[n] for n in per)
        return cell_seconds / args.workers / 3600

    eager_all = {n: e for n, e, _, _ in rows}
    scale = 6 / len(rows)  # the projection covers the six models; fewer measured: scaled
    print(
        f"\nPaper profile ({PAPER_CELLS_PER_MODEL * len(rows)} cells of the measured models"
        f"{'' if len(rows) == 6 else f', scaled ×{scale:.2f} to 6 models'}) with "
        f"{args.workers} workers on {device}:"
    )
    for epochs in (1000, args.epochs_run):
        e, b = hours(epochs, eager_all) * scale, hours(epochs, best) * scale
        print(f"  {epochs} epochs a cell: one by one {e:.1f} h, packed {b:.1f} h ({e / b:.2f}×)")


if __name__ == "__main__":
    main()
