"""``nllab simulate``: simulate (or load from the cache) the data sets of a configuration."""

from __future__ import annotations

import argparse
import time

from flows.cli import common as cli

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("simulate", help="simulate (or load from cache) the data sets")
    cli.add_selection(p, methods=False, device=False)
    p.set_defaults(handler=run, precheck=cli.check_selection)
    return p


def run(args: argparse.Namespace) -> int:
    config = cli.resolve(args)
    from tasks.cell import simulate_data
    from tasks.stopping import UserCodeExit, contained

    for system in config.systems:
        for seed in config.seeds:
            t0 = time.perf_counter()
            try:
                with contained():
                    ds = simulate_data(system, config.data_for(system), seed)
            except (ValueError, UserCodeExit) as e:  # a simulator's error, its data's problem
                raise cli.CommandFailed(f"{system} seed {seed}: {e}") from None
            print(
                f"{system:<24} seed {seed}  N={ds.x.shape[0]} T={ds.x.shape[1]} D={ds.x.shape[2]}"
                f"  fingerprint {ds.fingerprint[:12]}  {time.perf_counter() - t0:.1f} s"
            )
    return 0
