"""Simulate every benchmark system at N = 1000 (T = 200) and print seconds per system and total.

Target: under 60 s for all systems together on 2 cores.  Usage::

    PYTHONPATH=. python benchmarks/simulate_all.py [--n 1000] [--workers W]
"""

from __future__ import annotations

import argparse
import time

from datasets import SYSTEMS, simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="trajectories per system")
    ap.add_argument("--workers", type=int, default=None, help="processes for stiff Van der Pol")
    args = ap.parse_args()
    total = 0.0
    print(f"{'system':<24}{'N':>6}{'T':>5}{'seconds':>10}")
    for name in SYSTEMS:
        start = time.perf_counter()
        ds = simulate(name, n_trajectories=args.n, workers=args.workers)
        dt = time.perf_counter() - start
        total += dt
        print(f"{name:<24}{ds.n_trajectories:>6}{ds.n_points:>5}{dt:>10.3f}")
    print(f"{'total':<35}{total:>10.3f}")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
