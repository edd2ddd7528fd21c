"""The one generator of every figure in the README and the documentation site.

Numbers in ``README.md`` and ``docs/**/*.md`` come from committed records, never typed by hand:
the results ledger of the paper profile (``results/paper/ledger.jsonl``), the recorded quick
(or smoke) benchmark (``results/quick/PROFILE.json``, written by ``nllab benchmark --record``)
and the shipped profiles (``tasks/profiles/*.yaml``). Each generated block sits between two
marker lines::

    <!-- generated: NAME (python -m flows.docs_numbers) -->
    ...
    <!-- end of generated: NAME -->

(the ledger's Table 3 keeps the markers of ``nllab ledger table --readme``). ``python -m
flows.docs_numbers`` rewrites every block from the records; ``--check`` only says which blocks
differ (exit 1), and a default-suite test keeps the committed text equal to what this makes.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# The ledger block keeps the markers ``nllab ledger table --readme`` writes between.
from flows.cli.ledger import README_BEGIN as LEDGER_BEGIN
from flows.cli.ledger import README_END as LEDGER_END

__all__ = [
    "BLOCKS",
    "ROOT",
    "Block",
    "doc_files",
    "main",
    "regenerate",
    "rendered",
    "stale_blocks",
]

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python -m flows.docs_numbers"


@dataclass(frozen=True)
class Block:
    """A generated block: its markers and the function that makes its text from ``root``."""

    name: str
    make: Callable[[Path], str]
    begin: str = ""
    end: str = ""

    @property
    def markers(self) -> tuple[str, str]:
        return (
            self.begin or f"<!-- generated: {self.name} ({COMMAND}) -->",
            self.end or f"<!-- end of generated: {self.name} -->",
        )


# -- the records -------------------------------------------------------------------------------
def _run(root: Path, profile: str):
    from tasks.quick_record import read_quick_run

    path = root / "results" / "quick" / f"{profile}.json"
    return read_quick_run(path) if path.exists() else None


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min ({seconds:.0f} s)"


def _provenance(run, path: str) -> str:
    from tasks.quick_record import commits

    made = ", ".join(f"`{c[:10]}`" for c in commits(run.cells)) or "an unknown commit"
    return (
        f"`{path}`: {len(run.cells)} cells trained at commit {made} on {run.machine}, "
        f"recorded {run.date}; {run.cells_trained} trained and {run.cells_reused} reused by "
        f"the recorded command, {_minutes(run.wall_seconds)} from command to prompt"
    )


def _table(run) -> str:
    from tasks.reporting import render_table, results_table

    table = results_table(run.cells, profile=run.profile)
    text = table.to_markdown().rstrip()
    ranking = table.ranking()
    return text + ("\n\n" + render_table(ranking, "markdown").rstrip() if ranking.rows else "")


_SMOKE_CAVEAT = (
    "No quick run is recorded yet (`nllab benchmark --record results/quick/quick.json` writes "
    "one). The latest recorded **smoke** run is shown instead: 40 trajectories and 2 epochs per "
    "model, a check that the platform runs end to end, so its numbers say nothing about the "
    "models."
)


def quick_table(root: Path) -> str:
    """The recorded quick run's table and ranking (else the smoke run's, labelled as such)."""
    for profile in ("quick", "smoke"):
        run = _run(root, profile)
        if run is None:
            continue
        head = "" if profile == "quick" else _SMOKE_CAVEAT + "\n\n"
        where = f"results/quick/{profile}.json"
        return f"{head}{_table(run)}\n\nFrom {_provenance(run, where)}."
    return "No benchmark run is recorded yet (`nllab benchmark --record results/quick/quick.json`)."


def quick_time(root: Path) -> str:
    """How long the recorded quick run took, and on what (else that none is recorded)."""
    run = _run(root, "quick")
    if run is None:
        smoke = _run(root, "smoke")
        also = (
            f" The recorded smoke run took {_minutes(smoke.wall_seconds)} on {smoke.machine}."
            if smoke is not None
            else ""
        )
        return (
            "No quick run is recorded yet, so its time is not stated here: it depends on the "
            "machine and its load (the table does not)." + also
        )
    return (
        f"The recorded quick run took {_minutes(run.wall_seconds)} from command to prompt on "
        f"{run.machine} ({run.cells_trained} cells trained, recorded {run.date}); the time "
        "depends on the machine and its load, the table does not."
    )


def quick_cells(root: Path) -> str:
    """Every cell of the recorded quick (else smoke) run: RMSE, epochs, seconds, device."""
    from tasks.tables import Table, TableCell, number, render_table

    for profile in ("quick", "smoke"):
        run = _run(root, profile)
        if run is None:
            continue
        header = ("cell", "test RMSE", "epochs", "train s", "device", "run")
        rows = tuple(
            tuple(
                TableCell(v)
                for v in (
                    f"{c.system}/{c.method}/seed{c.seed}",
                    number(c.test_rmse),
                    "–" if c.epochs is None else str(c.epochs),
                    "–" if c.train_seconds is None else f"{c.train_seconds:.1f}",
                    c.device or "–",
                    f"`{(c.run_id or '–')[:12]}`",
                )
            )
            for c in run.cells
        )
        caption = f"Profile {profile}, from `results/quick/{profile}.json`."
        return render_table(Table(header, rows, caption), "markdown")
    return "No benchmark run is recorded yet."


def quick_epochs(root: Path) -> str:
    """The quick profile's epochs per model, from its profile file."""
    import yaml

    profile = yaml.safe_load((root / "tasks" / "profiles" / "quick.yaml").read_text())
    epochs = profile["method_epochs"]
    head = "| model | " + " | ".join(epochs) + " |"
    rule = "|---|" + "---|" * len(epochs)
    row = "| epochs (quick) | " + " | ".join(str(v) for v in epochs.values()) + " |"
    return "\n".join([head, rule, row])


def _ledger_records(root: Path):
    from flows.ledger import paper_config
    from tasks.ledger import read_ledger

    return read_ledger(root / "results" / "paper" / "ledger.jsonl"), paper_config().cells()


def ledger_table(root: Path) -> str:
    """The ledger's Table 3, as ``nllab ledger table --readme`` writes it."""
    from tasks.ledger_views import ledger_markdown

    return ledger_markdown(*_ledger_records(root))


def ledger_seeds(root: Path) -> str:
    """Each recorded seed of the ledger under today's config: method/system × seed."""
    from tasks.ledger import current_records
    from tasks.reporting import TOP_SHARE_FLAG
    from tasks.tables import Table, TableCell, number, render_table

    records, cells = _ledger_records(root)
    current = current_records(records, cells)
    seeds = sorted({r.seed for r in current})
    by_pair: dict[tuple[str, str], dict[int, str]] = {}
    for r in current:
        dominated = r.top_share is not None and r.top_share > TOP_SHARE_FLAG
        mark = f" ⚠ {r.top_share:.0%}" if dominated else ""
        by_pair.setdefault((r.method, r.system), {})[r.seed] = number(r.test_rmse) + mark
    rows = tuple(
        (TableCell(f"{m} / {s}"), *(TableCell(v.get(seed, "–")) for seed in seeds))
        for (m, s), v in by_pair.items()
    )
    caption = (
        "Test RMSE of each recorded seed; ⚠ and a share: the few worst test values carry that "
        "share of the error (a dominated cell)."
    )
    header = ("method / system", *(f"seed {s}" for s in seeds))
    return render_table(Table(header, rows, caption), "markdown")


BLOCKS: dict[str, Block] = {
    b.name: b
    for b in (
        Block("quick-table", quick_table),
        Block("quick-time", quick_time),
        Block("quick-cells", quick_cells),
        Block("quick-epochs", quick_epochs),
        Block("ledger", ledger_table, LEDGER_BEGIN, LEDGER_END),
        Block("ledger-seeds", ledger_seeds),
    )
}


# -- the files ---------------------------------------------------------------------------------
def doc_files(root: Path = ROOT) -> list[Path]:
    """The README and every page of the documentation site."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


_NAMED = re.compile(r"<!-- generated: ([\w-]+) \(")


def _blocks_in(text: str) -> list[Block]:
    found = [BLOCKS["ledger"]] if LEDGER_BEGIN in text else []
    for name in _NAMED.findall(text):
        if name not in BLOCKS:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(BLOCKS)}")
        found.append(BLOCKS[name])
    return found


def rendered(text: str, root: Path = ROOT, cache: dict[str, str] | None = None) -> str:
    """``text`` with every generated block made again from the records under ``root``."""
    cache = {} if cache is None else cache
    for block in _blocks_in(text):
        begin, end = block.markers
        if block.name not in cache:
            cache[block.name] = block.make(root).rstrip()
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise ValueError(f"block {block.name!r}: its end marker {end!r} is missing")
        body = f"{begin}\n{cache[block.name]}\n{end}"
        text = pattern.sub(lambda _m, body=body: body, text)
    return text


def stale_blocks(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """``file: block`` for each generated block whose text differs from the records'."""
    cache: dict[str, str] = {}
    stale = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        fresh = rendered(text, root, cache)
        if fresh != text:
            names = [b.name for b in _blocks_in(text)]
            stale.append(f"{path.relative_to(root)}: {', '.join(names)}")
    return stale


def regenerate(files: Iterable[Path], root: Path = ROOT) -> list[Path]:
    """Rewrite the generated blocks of ``files``; returns the files that changed."""
    cache: dict[str, str] = {}
    changed = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        fresh = rendered(text, root, cache)
        if fresh != text:
            path.write_text(fresh, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Rewrite the README's and the docs' figures from the records."
    )
    parser.add_argument("--check", action="store_true", help="only list stale blocks (exit 1)")
    args = parser.parse_args(argv)
    files = doc_files()
    if args.check:
        stale = stale_blocks(files)
        for line in stale:
            print(f"stale: {line}")
        return 1 if stale else 0
    for path in regenerate(files):
        print(f"{path.relative_to(ROOT)}: regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
