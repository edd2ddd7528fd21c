"""The default test suite's wall time: the command of ``make test`` (read from the Makefile, run
with this interpreter in the environment make gives it), timed once from start to exit, with
its test counts, the load average before and after, and the machine. ``--record`` writes
``results/measurements/suite_time.json`` (:mod:`tasks.reports.measurements`); ``python -m
flows.docs_numbers`` renders it in docs/development.md.

The load says how busy the machine was: the figure is a wall time, so run it when the machine
is as quiet as it gets (``uptime``), and say what else ran beside it with ``--note``.

    PYTHONPATH=. python benchmarks/suite_time.py [--record] [--note TEXT]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]

#: pytest's last line: "1036 passed, 3 skipped, 70 deselected, 2 warnings in 512.34s (0:08:32)"
_SUMMARY = re.compile(r"^=*\s*(\d+ \w+(?:, \d+ \w+)*) in [\d.]+s")


def make_test_command(makefile: Path = ROOT / "Makefile") -> list[str]:
    """The recipe of the Makefile's ``test`` target, ``$(PY)`` as this interpreter."""
    lines = makefile.read_text().splitlines()
    recipe = lines[next(i for i, line in enumerate(lines) if line.startswith("test:")) + 1]
    assert recipe.startswith("\t$(PY) "), f"make test's recipe is not one $(PY) line: {recipe}"
    return shlex.split(recipe.replace("$(PY)", shlex.quote(sys.executable)))


def make_environment(makefile: Path = ROOT / "Makefile") -> dict[str, str]:
    """This process's environment as make's recipes get it: without the variables the
    Makefile ``unexport``s."""
    dropped = {
        name
        for line in makefile.read_text().splitlines()
        if line.startswith("unexport ")
        for name in line.split()[1:]
    }
    return {k: v for k, v in os.environ.items() if k not in dropped}


def counts(summary: str) -> dict[str, int]:
    """``{"passed": 1036, "skipped": 3, ...}`` from pytest's last line (warnings left out)."""
    found = _SUMMARY.search(summary.strip().splitlines()[-1] if summary.strip() else "")
    if found is None:
        return {}
    pairs = (part.split(" ", 1) for part in found.group(1).split(", "))
    return {word: int(n) for n, word in pairs if word not in ("warning", "warnings")}


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s ({seconds:.0f} s)"


def run_suite(command: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """Run ``command`` in the repository (in ``env``, default this process's environment), its
    output passed through; wall seconds, exit code and the last line it printed."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    last = ""
    for line in proc.stdout:
        sys.stdout.write(line)
        last = line if line.strip() else last
    code = proc.wait()
    return time.monotonic() - t0, code, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="write results/measurements/")
    parser.add_argument("--note", default="", help="what else ran on the machine beside it")
    args = parser.parse_args(argv)
    command = make_test_command()
    before = _load()
    seconds, code, last = run_suite(command, make_environment())
    after = _load()
    found = counts(last)
    tests = ", ".join(f"{n} {word}" for word, n in found.items()) or f"exit code {code}"
    shown = " ".join(["python", *command[1:]])
    from tasks.tracking import git_commit

    row = (f"`{shown}`", _minutes(seconds), tests, before, after, git_commit()[:10])
    for name, value in zip(COLUMNS, row, strict=True):
        print(f"{name}: {value}")
    if args.record and code != 0:
        # the time of a suite that failed (a test, the collection, an interruption) is not the
        # suite's: the record keeps passing runs only
        print(f"not recorded: the suite did not pass (exit code {code})", file=sys.stderr)
        return code
    if args.record:
        from tasks.reports.measurements import record_measurement

        note = f"Load: 1, 5 and 15 min averages; the newest run first. {args.note}".strip()
        path = record_measurement(
            "suite_time",
            "the default test suite's wall time",
            "PYTHONPATH=. python benchmarks/suite_time.py --record",
            COLUMNS,
            with_history(row, RECORD),
            note,
        )
        print(f"recorded {path}")
    return code


#: The record's columns: one row per timed run, the newest first.
COLUMNS = ("command (make test)", "wall time", "tests", "load before", "load after", "commit")
RECORD = ROOT / "results" / "measurements" / "suite_time.json"
#: How many timed runs the record keeps: the range of wall times a reader may see.
KEEP = 5


def with_history(row: tuple[str, ...], record: Path) -> list[tuple[str, ...]]:
    """``row`` before the newest runs ``record`` already holds (at most :data:`KEEP` in all); a
    row of an older record without the commit column gets the record's commit."""
    if not record.is_file():
        return [row]
    from tasks.reports.measurements import read_measurement

    old = read_measurement(record)
    earlier = [tuple(r) + ((old.commit,) if len(r) < len(COLUMNS) else ()) for r in old.rows]
    return [row, *earlier][:KEEP]


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics(defer=True)  # the suite it times inherits the mode's environment
    sys.exit(main())
