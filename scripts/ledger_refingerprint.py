"""Carry the ledger's records over to today's numerics fingerprints, where their code proves it.

A record's ``numerics`` are the fingerprints (:mod:`nltrain.numerics._fingerprints`) of its model
and its data set as the fingerprint module of its day computed them. When that module changes what
its canaries run (to cover the model's settings, the cell's state dimension and batch sizes, the
cell's split), every record reads as made by older numerics, although most were made by code
that computes today's bytes. This script shows that record by record: for each commit that made
records, a git worktree of that commit (its own ``nlmodels``, ``nltrain`` and ``datasets``)
computes

1. with the fingerprint module of ``--before`` (the revision whose module the records'
   fingerprints come from), the record's fingerprints, which must be the ones it holds (so the
   versions and numerics modes hashed in them are today's too), and
2. with today's fingerprint module, the cell's fingerprints, which must be today's.

Where both hold, the record's ``numerics`` become today's and its note keeps the old ones;
every other record stays as it is (``nllab ledger status`` lists it; ``nllab ledger run
--refresh-older`` retrains it). Lines it does not change keep their bytes. Run it when no
``nllab ledger run`` writes to the same file.

    PYTHONPATH=. python scripts/ledger_refingerprint.py --before REV [--ledger FILE] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODULE = "nltrain/numerics/_fingerprints.py"
#: Where the fingerprint module lived before :mod:`nltrain.numerics` held it (the commits the
#: ledger's records name, and a ``--before`` of their day).
EARLIER_MODULES = ("nltrain/numerics/_fingerprints.py",)
#: Copied from this tree with today's fingerprint module: the CPU facts its cache is keyed by
#: (standard library only, a superset of every earlier version's) and the rest of its room.
HELPERS = (
    "nlmodels/_cpu.py",
    *(p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "nltrain/numerics").glob("*.py"))),
)
#: What runs in the old commit's tree: for each cell asked, its fingerprints by the module of
#: ``--before`` (copied in as ``_fingerprints_before``) and by today's (as ``_fingerprints``).
CHILD = """
import json, sys
import nlmodels
from nlmodels import _cpu, set_up_numerics
if not hasattr(nlmodels, "numerics_environment"):  # a tree older than the name: this tree's
    nlmodels.numerics_environment = _cpu.numerics_environment
set_up_numerics()
from nltrain import _fingerprints_before as before
from nltrain.numerics import _fingerprints as today
out = []
for method, settings, dim, training, system, data in json.loads(sys.argv[1]):
    settings, training, data = json.loads(settings), json.loads(training), json.loads(data)
    old = (before.model_fingerprint(method, settings), before.system_fingerprint(system))
    new = (today.model_fingerprint(method, settings, dim, training),
           today.system_fingerprint(system, data))
    out.append(["/".join(old), "/".join(new)])
print(json.dumps(out))
"""


def cell_of(record):
    """Today's cell of ``record``, or None when the record is of another config (history, not
    counted)."""
    from tasks.ledger.scope import ABLATIONS, paper_config

    (cell,) = paper_config(
        methods=[record.method],
        systems=[record.system],
        seeds=[record.seed],
        models=ABLATIONS.get(record.ablation, {}),
    ).cells()
    return cell if cell.config_hash() == record.config_hash else None


def asked_of(cell) -> tuple:
    """What the child computes for ``cell``: the keys of its model's and its data set's canaries
    (:func:`tasks.machine.numerics.model_key`, :func:`tasks.machine.numerics.system_key`)."""
    from tasks.machine.numerics import model_key, system_key

    return (*model_key(cell), *system_key(cell))


def at_commit(commit: str, before: bytes, asked: list[tuple]) -> dict[tuple, tuple] | str:
    """(the ``before`` module's, today's module's) numerics of each of ``asked`` computed by
    ``commit``'s code, or why they could not be."""
    with tempfile.TemporaryDirectory(prefix="refingerprint-") as scratch:
        tree = Path(scratch) / "tree"
        add = ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit]
        done = subprocess.run(add, capture_output=True, text=True)
        if done.returncode:
            return f"no worktree of {commit[:10]}: {done.stderr.strip()}"
        try:
            if not any((tree / m).is_file() for m in (MODULE, *EARLIER_MODULES)):
                return f"{commit[:10]} has no {MODULE} (its fingerprints came from elsewhere)"
            for path in (MODULE, *HELPERS):
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                (tree / path).write_bytes((ROOT / path).read_bytes())
            (tree / "nltrain/_fingerprints_before.py").write_bytes(before)
            env = {**os.environ, "PYTHONPATH": str(tree), "NLLAB_HOME": str(Path(scratch) / "h")}
            args = [list(a) for a in asked]
            child = subprocess.run(
                [sys.executable, "-c", CHILD, json.dumps(args)],
                capture_output=True, text=True, cwd=tree, env=env,
            )  # fmt: skip
            if child.returncode:
                return f"{commit[:10]}'s code: {child.stderr.strip().splitlines()[-1]}"
            got = json.loads(child.stdout.strip().splitlines()[-1])
            return {a: tuple(pair) for a, pair in zip(asked, got, strict=True)}
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )


def carry_over(ledger: Path, before_rev: str, dry_run: bool) -> int:
    """Rewrite the records of ``ledger`` whose commit's code gives today's numerics; the
    number rewritten."""
    from tasks.ledger import LedgerRecord, cell_numerics, read_ledger

    for module in (MODULE, *EARLIER_MODULES):
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{before_rev}:{module}"], capture_output=True
        )
        if not shown.returncode:
            break
    else:
        raise SystemExit(f"no {MODULE} at {before_rev!r}: {shown.stderr.decode().strip()}")
    candidates: dict[str, list] = {}
    today: dict[str, tuple[tuple, str]] = {}  # record key -> (asked, today's numerics)
    for r in read_ledger(ledger):
        if not (r.numerics and r.commit):
            continue
        cell = cell_of(r)
        if cell is None:
            continue
        numerics = cell_numerics(cell)
        if r.numerics != numerics:
            today[r.key] = (asked_of(cell), numerics)
            candidates.setdefault(r.commit, []).append(r)
    updates: dict[str, str] = {}
    for commit, records in sorted(candidates.items()):
        asked = sorted({today[r.key][0] for r in records})
        got = at_commit(commit, shown.stdout, asked)
        if isinstance(got, str):
            print(f"{len(records)} record(s) of {commit[:10]} kept: {got}")
            continue
        for r in records:
            cell_asked, numerics = today[r.key]
            old, new = got[cell_asked]
            if old == r.numerics and new == numerics:
                updates[r.key] = numerics
            else:
                why = "its fingerprints" if old != r.numerics else "today's canaries' bytes"
                print(f"{r.cell_key} ({commit[:10]}) kept: {why} differ from today's")
    out = []
    for line in ledger.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.strip():
            r = LedgerRecord.from_mapping(json.loads(line))
            if r.key in updates:
                note = f"numerics {r.numerics} by the fingerprints of {before_rev[:10]}"
                note = "; ".join(filter(None, [r.note, note]))
                r = replace(r, numerics=updates[r.key], note=note)
                line = r.to_json() + "\n"
        out.append(line)
    print(f"{len(updates)} record(s) carried over to today's numerics fingerprints")
    if updates and not dry_run:
        tmp = ledger.with_suffix(".tmp")
        tmp.write_text("".join(out), encoding="utf-8")
        os.replace(tmp, ledger)
    return len(updates)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--before",
        required=True,
        help="the revision whose fingerprint module computed the records' numerics",
    )
    ap.add_argument("--ledger", type=Path, default=ROOT / "results" / "paper" / "ledger.jsonl")
    ap.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    args = ap.parse_args(argv)
    if not args.ledger.is_file():
        raise SystemExit(f"no ledger at {args.ledger}")
    carry_over(args.ledger, args.before, args.dry_run)


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the fingerprints' canaries train
    main()
