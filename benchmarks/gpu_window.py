"""What a GPU window would add to the results ledger: the cells ``nllab ledger run --device cuda
--max-minutes M`` is expected to train in M minutes on a machine whose ``make gpu-check`` left
its ``throughput.json``, planned by the ledger's own rules on those timings instead of the
machine's probes.

The missing cells of the ledger come in the ledger's order (:func:`flows.ledger.ledger_groups`,
seeds merged as on a GPU); each group is planned as the engine would plan it
(:func:`tasks.engine.estimate_packs`, :func:`benchmarks.throughput.table_measure`) and cut to
its packs that fit the minutes left (:func:`flows.ledger.fitting_parts`: the margin and the
fixed cost of each benchmark allowed for, GPU packs one after another). Use it to choose M
before a window, or to see which columns a window of that length can never reach (a pack that
needs more than one command may run).

    PYTHONPATH=. python benchmarks/gpu_window.py gpu-check/throughput.json --minutes 5 9.5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.throughput import read_timings, table_measure
from flows.ledger import fitting_parts, group_config, ledger_groups, to_train
from tasks.engine import estimate_packs
from tasks.ledger import DEFAULT_LEDGER, ledger_scope, read_ledger
from tasks.ledger.views import cell_states


def plan_window(
    throughput: Path,
    minutes: float,
    ledger: Path,
    free_bytes: int | None = None,
    device: str = "cuda",
    workers: int = 16,
    profile: str = "paper",
) -> list[tuple[str, int, int, float]]:
    """(group, cells expected to be recorded, cells of the group, seconds used) for each group,
    in order, on a machine with ``workers`` workers (``--device`` ``device``), of the ledger's
    ``profile``."""
    rows = read_timings(throughput)
    scope = ledger_scope(profile=profile, ledger=ledger)
    states = cell_states(read_ledger(ledger, scope), scope.select())
    execution = {"device": device, "max_workers": workers}
    left, planned = minutes * 60, []
    for group in ledger_groups(to_train(states), states, merge_seeds=True):
        config = group_config(group, {"profile": profile}, execution)
        with tempfile.TemporaryDirectory(prefix="nllab-window-") as tmp:
            estimates = estimate_packs(
                config,
                cache_dir=Path(tmp),
                measure=table_measure(rows),
                cuda_available=True,
                free_bytes=free_bytes,
            )
        parts = fitting_parts(group, estimates, left, config.execution.max_workers)
        used = sum(needed for _, needed in parts)
        planned.append((group.label, sum(p.size for p, _ in parts), group.size, used))
        left -= used
    return planned


def main(argv: list[str] | None = None) -> int:
    from nlmodels import set_up_numerics

    set_up_numerics()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("throughput", type=Path, help="a gpu-check's throughput.json")
    ap.add_argument("--minutes", type=float, nargs="+", default=[5.0, 9.5], metavar="M")
    ap.add_argument("--ledger", type=Path, default=DEFAULT_LEDGER)
    ap.add_argument("--device", choices=("cuda", "auto"), default="cuda")
    ap.add_argument("--workers", type=int, default=16, help="the GPU node's workers")
    ap.add_argument(
        "--free-gib",
        type=float,
        help="the GPU's free memory (default: the check.json beside the throughput file)",
    )
    args = ap.parse_args(argv)
    if not args.throughput.is_file():
        ap.error(f"{args.throughput} not found: give a gpu-check's throughput.json")
    check = args.throughput.parent / "check.json"
    if args.free_gib:
        free = int(args.free_gib * 2**30)
    elif check.is_file() and json.loads(check.read_text()).get("free_bytes"):
        free = int(json.loads(check.read_text())["free_bytes"])
    else:
        ap.error(f"no free_bytes in {check}: give the GPU's free memory with --free-gib")
    for minutes in args.minutes:
        plan = plan_window(args.throughput, minutes, args.ledger, free, args.device, args.workers)
        total = sum(n for _, n, _, _ in plan)
        print(f"\n{minutes:g} min, --device {args.device}: {total} cells expected to be recorded")
        print("| group | cells recorded | of | seconds |\n|---|---|---|---|")
        for label, n, of, used in plan:
            print(f"| {label} | {n} | {of} | {used:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
