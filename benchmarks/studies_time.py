"""Wall time of every study of the paper on one profile (quick: all twelve in under an hour).

Runs each study in turn exactly as ``nllab study NAME --profile PROFILE`` does, against the
configured tracking store (point ``NLLAB_HOME`` at a fresh folder for a cold measurement), and
prints seconds per study, cells run and reused, and the total.

    NLLAB_HOME=$(mktemp -d) python benchmarks/studies_time.py [--profile quick] [--studies a b]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    from flows.studies import STUDIES, run_study, study_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="quick", choices=("smoke", "quick", "paper"))
    parser.add_argument("--studies", nargs="+", default=list(STUDIES), metavar="NAME")
    args = parser.parse_args()
    rows, start = [], time.perf_counter()
    for name in args.studies:
        t0 = time.perf_counter()
        summary = run_study(study_config(name, args.profile))
        seconds = time.perf_counter() - t0
        reused = sum(c.status == "reused" for c in summary.cells)
        failed = sum(not c.ok for c in summary.cells)
        rows.append((name, seconds, len(summary.cells), reused, failed))
        print(
            f"{name:<18} {seconds:7.0f} s  {len(summary.cells):3d} cells "
            f"({reused} reused, {failed} failed)",
            flush=True,
        )
    total = time.perf_counter() - start
    print(
        f"\nall {len(rows)} studies, profile {args.profile}: {total:.0f} s = {total / 60:.1f} min "
        f"({sum(r[2] for r in rows)} cells, {sum(r[4] for r in rows)} failed)"
    )


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
