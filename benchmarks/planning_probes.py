"""Where a benchmark's planning goes before its first cell trains: every probe
:func:`tasks.engine.plan_packs` takes under ``--device auto`` on this machine, timed one by one,
and the planning's wall time beside their sum (the CPU probes that run in other processes
meanwhile, :class:`tasks.machine.placement.CpuProbesAhead`, are not timed one by one: the wall time
shows what they add to the planning).

On a fresh GPU machine the probes are not cached yet, so this is what a first ``nllab benchmark
--device auto`` waits for; a fresh cache each run (the machine's own is not touched). Without
CUDA the planning measures nothing; ``--fake-cuda`` then stands a 10 ms GPU probe in for each
GPU probe, to rehearse the script and time the CPU side.

    PYTHONPATH=. python benchmarks/planning_probes.py --seeds 0 1 2 3 4 --compare
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import tasks.engine as engine
import tasks.machine.placement as placement
from nlmodels import set_up_numerics
from tasks.config import MAIN_SYSTEMS, resolve_config
from tasks.engine import plan_packs
from tasks.machine.placement import Probe, probe_pack


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", nargs="+", default=list(MAIN_SYSTEMS))
    ap.add_argument("--methods", nargs="+", help="default: the profile's")
    ap.add_argument(
        "--profile", default="paper", choices=("paper", "fair"), help="whose cells (default: paper)"
    )
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--workers", type=int, default=16, help="the benchmark's max_workers")
    ap.add_argument("--threads", type=int, default=1, help="torch threads a worker probes with")
    ap.add_argument("--fake-cuda", action="store_true", help="no GPU: stand-in GPU probes")
    ap.add_argument(
        "--compare", action="store_true", help="also plan with every CPU probe in this process"
    )
    args = ap.parse_args(argv)
    if args.fake_cuda == torch.cuda.is_available():
        ap.error("--fake-cuda is for machines without CUDA (and needed there)")
    set_up_numerics()
    torch.set_num_threads(args.threads)
    over: dict = {"systems": args.systems, "seeds": args.seeds}
    if args.methods:
        over["methods"] = args.methods
    cells = resolve_config(args.profile, overrides=over).cells()
    timed: list[tuple[str, str, int, float]] = []

    def timed_probe(cell, device, members):
        if args.fake_cuda and device.type == "cuda":
            return Probe(0.01, 2**20)
        t0 = time.perf_counter()
        got = probe_pack(cell, device, members)
        timed.append((cell.method, device.type, members, time.perf_counter() - t0))
        print(
            f"probe {cell.method:15s} {cell.system:22s} {device.type:4s} ×{members:<3d} "
            f"{timed[-1][3]:6.2f} s -> {got.seconds:.4f} s per cell-epoch",
            flush=True,
        )
        return got

    placement.probe_pack = timed_probe  # this process's probes (not the other processes')
    fake = {"cuda_available": True, "free_bytes": 64 * 2**30} if args.fake_cuda else {}
    walls = {}
    for how in ("ahead", "in-process") if args.compare else ("ahead",):
        if how == "in-process":  # the baseline: every CPU probe in this process, in turn
            engine.CpuProbesAhead = functools.partial(placement.CpuProbesAhead, processes=0)
        timed.clear()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="nllab-planning-") as tmp:
            placed = plan_packs(
                cells, pack=True, device="auto", cache_dir=Path(tmp), workers=args.workers,
                **fake,
            )  # fmt: skip
        walls[how] = time.perf_counter() - t0
        print(f"CPU probes {how}:")
        for d in ("cuda", "cpu"):
            secs = [t for _, dev, _, t in timed if dev == d]
            print(f"  {d}: {len(secs)} probes in this process, {sum(secs):.1f} s")
        print(f"  planning: {walls[how]:.1f} s for {len(cells)} cells in {len(placed)} packs")
    if args.compare:
        ratio = walls["in-process"] / walls["ahead"]
        print(f"planning with the CPU probes ahead: {ratio:.2f}x as fast as in-process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
