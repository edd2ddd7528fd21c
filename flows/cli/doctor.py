"""``nllab doctor``: what a user runs on a new machine (the convention of ``brew doctor`` and
``flutter doctor``): the CPU numerics in effect and what they pin, each BLAS library loaded and
its kernel choice, the native kernels' target and build, CUDA devices, the stores and their
health, and this machine's bytes against the pinned ones, a difference named by the component
that computes it (``tasks.machine.doctor``). Exit 0 when all is as pinned, 1 otherwise; the verdict
is kept in the home, and the next runs are tagged with it (``numerics.pinned``)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]

_MARK = {"ok": "✓", "info": "·", "warn": "!", "fail": "✗"}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "doctor",
        help="check this machine: numerics, libraries, native kernels, CUDA, stores, "
        "and its bytes against the pinned ones",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="recompute the pinned bytes (default: reuse this machine's check of today's code)",
    )
    # a home it cannot write is one of its findings (exit 1), not a refusal to run
    p.set_defaults(handler=run, checks_home=True)
    return p


def run(args: argparse.Namespace) -> int:
    from tasks.machine.doctor import diagnose, failed, problem_lines

    findings = diagnose(fresh=args.fresh)
    section = None
    width = max(len(f.label) for f in findings)
    for f in findings:
        if f.section != section:
            section = f.section
            print(f"\n{section}")
        print(f"  {_MARK[f.status]} {f.label:<{width}}  {f.value}")
    problems = problem_lines(findings)
    print()
    if problems:
        failures = sum(f.status == "fail" for f in findings)
        head = f"{failures} failed check{'s' if failures != 1 else ''}"
        causes = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        print(f"nllab doctor: {head}, {causes}:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
    else:
        print("nllab doctor: all as pinned")
    return 1 if failed(findings) else 0
