"""What the first command of a new home costs: ``nllab ledger status`` in a fresh home, against
the same command warm, measured in the same run.

Each round starts the command three times, each in its own process, in folders made for the
round:

* **cold**: a new home beside an empty installation cache (``NLLAB_INSTALL_CACHE``): a new
  installation, or the first command after an edit of ``nltrain``, ``nlmodels`` or
  ``datasets``; every numerics canary of the ledger's cells trains;
* **new home**: a second new home beside that installation cache, as a user's second home, a
  CI job's or a test's: the canaries' fingerprints are the installation's
  (:func:`datasets.installation_cache`), none trains;
* **warm**: that home again.

It prints the median wall and CPU seconds (the child's user and system time) of each start
over ``--repeats`` rounds, how many canaries each trained (records the installation cache
gained) and the load average, since the figures are wall times on a shared machine.

    PYTHONPATH=. python benchmarks/cold_start.py [--repeats 3] [--command "ledger status"]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTS = ("cold", "new home", "warm")
COLUMNS = ("start", "wall (s)", "CPU (s)", "canaries trained")


def start(command: Sequence[str], home: Path, installation: Path) -> tuple[float, float, int]:
    """Run ``nllab command`` in ``home`` beside ``installation``: wall and CPU seconds, and
    the numerics records the installation cache gained (one per canary trained)."""
    env = {**os.environ, "NLLAB_HOME": str(home), "NLLAB_INSTALL_CACHE": str(installation)}
    env["PYTHONPATH"] = str(ROOT)
    records = installation / "numerics"
    before = len(list(records.glob("*.json"))) if records.is_dir() else 0
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *command],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # 1: a check failed (doctor), still a whole start
        sys.exit(f"nllab {shlex.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)
    return wall, cpu, len(list(records.glob("*.json"))) - before


def measure(command: Sequence[str], repeats: int) -> dict[str, list[tuple[float, float, int]]]:
    """Each start's figures, one per round (each round with new folders)."""
    out: dict[str, list[tuple[float, float, int]]] = {name: [] for name in STARTS}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="nllab-cold-start-") as tmp:
            installation, first, second = (Path(tmp, n) for n in ("installation", "a", "b"))
            for name, home in zip(STARTS, (first, second, second), strict=True):
                out[name].append(start(command, home, installation))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="rounds (medians are printed)")
    ap.add_argument("--command", default="ledger status", help="the nllab command to start")
    args = ap.parse_args(argv)
    command = shlex.split(args.command)
    if not command:
        ap.error("--command must name an nllab command")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    load_before = os.getloadavg()
    figures = measure(command, args.repeats)
    median = {
        name: [statistics.median(f[i] for f in rounds) for i in range(3)]
        for name, rounds in figures.items()
    }
    print(f"| {' | '.join(COLUMNS)} |\n|{'|'.join('---' for _ in COLUMNS)}|")
    for name, (wall, cpu, trained) in median.items():
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {trained:.0f} |")
    load = ", ".join(f"{a:.1f}-{b:.1f}" for a, b in zip(load_before, os.getloadavg(), strict=True))
    print(
        f"\n`nllab {shlex.join(command)}`, median of {args.repeats}: a new home "
        f"{median['new home'][0] / median['warm'][0]:.1f}x the warm start's wall time, the cold "
        f"start {median['cold'][0] / median['warm'][0]:.1f}x. {os.cpu_count()} cores, load "
        f"(1, 5, 15 min; before-after) {load}."
    )


if __name__ == "__main__":
    main()
