"""Carry the ledger's records over to model fingerprints that cover the model's settings.

A model's numerics fingerprint (:func:`nltrain.model_fingerprint`) is its canary training's
bytes. It used to build the model at its defaults only, so a record of a cell whose model has
other settings (the paper profile's Neural Flows with linear time functions and its Latent ODE,
the stereographic ablation) carried the defaults' fingerprint, which an edit of the code only
those settings reach would not change. Today the canary builds the model as the cell does, and
those records read as made by older numerics until this script shows, record by record, that
their code computes today's bytes: for each commit that made such records, a git worktree of
that commit (its own ``nlmodels``, ``nltrain`` and ``datasets``) computes, with this tree's
fingerprint module,

1. the defaults' fingerprint, which must be the one the record holds (so the versions and
   numerics modes hashed in it are today's too), and
2. the fingerprint of the cell's settings, which must be today's.

Where both hold, the record's model fingerprint becomes today's and its note keeps the old one;
every other record stays as it is (``nllab ledger status`` lists it; ``nllab ledger run
--refresh-older`` retrains it). Lines it does not change keep their bytes. Run it when no
``nllab ledger run`` writes to the same file.

    PYTHONPATH=. python scripts/ledger_refingerprint.py [--ledger FILE] [--dry-run]
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

FINGERPRINTS = ROOT / "nltrain" / "_fingerprints.py"
#: What runs in the old commit's tree: the defaults' and the settings' fingerprints of each
#: (method, settings) asked, by this tree's fingerprint module over that tree's code.
CHILD = """
import json, sys
from nlmodels import set_up_numerics
set_up_numerics()
from nltrain._fingerprints import model_fingerprint
asked = json.loads(sys.argv[1])
print(json.dumps([[model_fingerprint(m), model_fingerprint(m, s)] for m, s in asked]))
"""


def settings_of(record) -> dict | None:
    """The settings a fingerprint covers of ``record``'s model, as its cell builds it today;
    None when the record is of another config than today's cell (history, not counted)."""
    from nltrain import model_settings
    from tasks.ledger_scope import ABLATIONS, paper_config

    overrides = ABLATIONS.get(record.ablation, {})
    (cell,) = paper_config(
        methods=[record.method], systems=[record.system], seeds=[record.seed], models=overrides
    ).cells()
    if cell.config_hash() != record.config_hash:
        return None
    return model_settings(record.method, cell.model)


def at_commit(commit: str, asked: list[tuple[str, dict]]) -> list[tuple[str, str]] | str:
    """(defaults', settings') fingerprints of each of ``asked`` computed by ``commit``'s code,
    or why they could not be."""
    with tempfile.TemporaryDirectory(prefix="refingerprint-") as scratch:
        tree = Path(scratch) / "tree"
        add = ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit]
        done = subprocess.run(add, capture_output=True, text=True)
        if done.returncode:
            return f"no worktree of {commit[:10]}: {done.stderr.strip()}"
        try:
            (tree / "nltrain" / "_fingerprints.py").write_bytes(FINGERPRINTS.read_bytes())
            env = {**os.environ, "PYTHONPATH": str(tree), "NLLAB_HOME": str(Path(scratch) / "h")}
            child = subprocess.run(
                [sys.executable, "-c", CHILD, json.dumps(asked)],
                capture_output=True, text=True, cwd=tree, env=env,
            )  # fmt: skip
            if child.returncode:
                return f"{commit[:10]}'s code: {child.stderr.strip().splitlines()[-1]}"
            return [tuple(pair) for pair in json.loads(child.stdout.strip().splitlines()[-1])]
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )


def carry_over(ledger: Path, dry_run: bool) -> int:
    """Rewrite the records of ``ledger`` whose commit's code gives today's fingerprint of their
    settings; the number rewritten."""
    from nltrain import model_fingerprint
    from tasks.ledger import LedgerRecord, read_ledger

    candidates: dict[str, list] = {}
    settings: dict[tuple, dict] = {}  # (method, ablation) -> the settings of today's cells
    for r in read_ledger(ledger):
        if not (r.numerics and r.commit):
            continue
        s = settings_of(r)
        if s and r.numerics.split("/")[0] != model_fingerprint(r.method, s):
            settings[(r.method, r.ablation)] = s
            candidates.setdefault(r.commit, []).append(r)
    updates: dict[tuple, str] = {}
    for commit, records in sorted(candidates.items()):
        asked = sorted({(r.method, json.dumps(settings[(r.method, r.ablation)], sort_keys=True))
                        for r in records})  # fmt: skip
        got = at_commit(commit, [(m, json.loads(s)) for m, s in asked])
        if isinstance(got, str):
            print(f"{len(records)} record(s) of {commit[:10]} kept: {got}")
            continue
        found = dict(zip(asked, got, strict=True))
        for r in records:
            s = settings[(r.method, r.ablation)]
            old_default, old_settings = found[(r.method, json.dumps(s, sort_keys=True))]
            today = model_fingerprint(r.method, s)
            model, system = r.numerics.split("/")
            if model == old_default and old_settings == today:
                updates[r.key] = f"{today}/{system}"
            else:
                why = "its fingerprint" if model != old_default else "its settings' bytes"
                print(f"{r.cell_key} ({commit[:10]}) kept: {why} differ from today's")
    lines = ledger.read_text(encoding="utf-8").splitlines(keepends=True)
    out = []
    for line in lines:
        if not line.strip():
            out.append(line)
            continue
        r = LedgerRecord.from_mapping(json.loads(line))
        if r.key in updates:
            note = f"model fingerprint {r.numerics.split('/')[0]} before it covered settings"
            r = replace(r, numerics=updates[r.key], note="; ".join(filter(None, [r.note, note])))
            line = r.to_json() + "\n"
        out.append(line)
    print(f"{len(updates)} record(s) carried over to their settings' fingerprints")
    if updates and not dry_run:
        tmp = ledger.with_suffix(".tmp")
        tmp.write_text("".join(out), encoding="utf-8")
        os.replace(tmp, ledger)
    return len(updates)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", type=Path, default=ROOT / "results" / "paper" / "ledger.jsonl")
    ap.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    args = ap.parse_args(argv)
    if not args.ledger.is_file():
        raise SystemExit(f"no ledger at {args.ledger}")
    carry_over(args.ledger, args.dry_run)


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the fingerprints' canaries train
    main()
