"""The README and the documentation site (``docs/``) as a reader meets them: every command and
Python block is either run here or says why not (``<!-- doctest: fast|slow|skip: REASON -->``
on the line before it, see docs/development.md), and every figure between generated markers is
what ``python -m flows.docs_numbers`` makes from the committed records."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from flows.docs_numbers import doc_files, rendered, stale_blocks
from tasks.ledger.quick_record import (
    QuickCell,
    QuickRun,
    RecordError,
    read_quick_run,
    write_quick_run,
)

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"bash", "sh", "shell", "console", "python", "py"}
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- doctest: (fast|slow|skip: \S.*?) -->$")


@dataclass(frozen=True)
class DocBlock:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    marker: str | None  # fast, slow, skip: …; None when the line before has none
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_blocks(paths: list[Path]) -> list[DocBlock]:
    """Every fenced block of ``paths`` with its language and the marker on the line before."""
    blocks = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if not m or not m.group(1):
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = _MARKER.match(lines[i - 1]) if i else None
            code = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(DocBlock(path, i + 1, m.group(1), before and before.group(1), code))
            i = end + 1
    return blocks


BLOCKS = [b for b in doc_blocks(doc_files(ROOT)) if b.lang in RUNNABLE]


def _runs(kind: str) -> list:
    return [pytest.param(b, id=b.id) for b in BLOCKS if b.marker == kind]


def test_every_command_and_python_block_says_whether_it_runs():
    unmarked = [b.id for b in BLOCKS if b.marker is None]
    assert not unmarked, f"blocks without a <!-- doctest: … --> marker: {unmarked}"
    assert _runs("fast") and _runs("slow")  # the parser finds both kinds


def test_marker_parser_on_a_made_up_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n<!-- doctest: skip: a server -->\n```bash\nnllab ui\n```\n\n"
        "```toml\nx = 1\n```\n```python\nprint(1)\n```\n"
    )
    got = [(b.lang, b.marker, b.code) for b in doc_blocks([page])]
    assert got == [
        ("bash", "skip: a server", "nllab ui\n"),
        ("toml", None, "x = 1\n"),
        ("python", None, "print(1)\n"),
    ]


@pytest.fixture(scope="module")
def reader_env(tmp_path_factory) -> dict[str, str]:
    """What a reader has after the README's set-up: ``nllab`` and ``python`` on the path, the
    example plugin installed (its entry point on ``PYTHONPATH``), nothing tracked elsewhere."""
    tmp = tmp_path_factory.mktemp("reader")
    bin_ = tmp / "bin"
    bin_.mkdir()
    for name, run in (("nllab", "-m flows.cli"), ("python", "")):
        (bin_ / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {run} "$@"\n')
        (bin_ / name).chmod(0o755)
    info = tmp / "site" / "nllab_deepsets-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nllab-deepsets\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[nllab.models]\ndeepsets = nllab_deepsets\n")
    paths = [ROOT, ROOT / "examples" / "nllab_deepsets", info.parent]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_"))}
    env.pop("NLLAB_ARTIFACT_ROOT", None)
    return {
        **env,
        "PATH": f"{bin_}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(map(str, paths)),
    }


def _run_block(block: DocBlock, env: dict[str, str], tmp: Path, timeout: int) -> None:
    """Run ``block`` in a scratch folder whose entries link to the repository's (so relative
    paths such as ``examples/…`` resolve and nothing is written into the repository)."""
    work = tmp / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (work / entry.name).symlink_to(entry)
    env = {**env, "NLLAB_HOME": str(tmp / "home")}
    if block.lang in ("python", "py"):
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (
        f"{block.id} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    )
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("block", _runs("fast"))
def test_fast_doc_block_runs(block, reader_env, tmp_path):
    _run_block(block, reader_env, tmp_path, timeout=180)


@pytest.mark.slow
@pytest.mark.parametrize("block", _runs("slow"))
def test_slow_doc_block_runs(block, reader_env, tmp_path):
    _run_block(block, reader_env, tmp_path, timeout=1800)


def test_the_readmes_links_reach_files_of_the_repository():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert len(local) > 10 and [t for t in local if not (ROOT / t).exists()] == []


def test_the_readme_is_a_guide_of_at_most_200_lines_none_over_400_characters():
    """The README guides (what it is, the two commands, the quick table, one summary of the
    full-budget results); tables and measurements live on the site's pages."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    too_long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 400]
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    assert too_long == [], f"README.md lines over 400 characters (line, length): {too_long}"


# -- generated figures --------------------------------------------------------------------------
def test_every_generated_block_equals_what_the_records_make():
    stale = stale_blocks(doc_files(ROOT), ROOT)
    assert not stale, f"run `python -m flows.docs_numbers`: stale generated blocks {stale}"


def test_the_list_of_generated_figures_names_every_block_and_every_record():
    from flows.docs_numbers import BLOCKS, generated_figures

    text = generated_figures(ROOT)
    records = sorted(p.stem for p in (ROOT / "results" / "measurements").glob("*.json"))
    assert len(records) > 10 and [r for r in records if f"| `{r}` |" not in text] == []
    assert [name for name in BLOCKS if f"| `{name}` |" not in text] == []
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    assert "<!-- generated: generated-figures (" in page


def test_the_ledger_block_has_the_markers_of_nllab_ledger_table():
    from flows import docs_numbers
    from flows.cli import ledger

    assert (docs_numbers.LEDGER_BEGIN, docs_numbers.LEDGER_END) == (
        ledger.README_BEGIN,
        ledger.README_END,
    )


def test_a_hand_edited_figure_is_put_back_by_the_generator():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("<!-- generated: quick-table", 1)[1].split("<!-- end of generated", 1)[0]
    figure = re.search(r"\b\d\.\d{3,}\b", table).group(0)
    edited = text.replace(figure, figure[:-1] + str((int(figure[-1]) + 1) % 10), 1)
    assert edited != text and rendered(edited, ROOT) == text


def _cell(system: str, method: str, rmse: float) -> QuickCell:
    return QuickCell(
        system=system,
        method=method,
        seed=0,
        test_rmse=rmse,
        config_hash="c" * 64,
        commit="0123456789abcdef",
        numerics="m/s",
        device="cpu",
        hardware="some CPU",
        train_seconds=1.5,
        epochs=2,
        run_id="r" * 32,
    )


def _run(profile: str, cells: tuple[QuickCell, ...]) -> QuickRun:
    return QuickRun(
        profile, "0123456789abcdef", "p" * 32, 600.0, 500.0, 2, 0, "a CPU", "2030-01-01", cells
    )


def test_quick_record_round_trip_and_the_generated_table(tmp_path):
    cells = (_cell("integro_de", "node", 0.25), _cell("integro_de", "neural_laplace", 0.125))
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- generated: quick-table (python -m flows.docs_numbers) -->\n"
        "<!-- end of generated: quick-table -->\n"
        "<!-- generated: quick-time (python -m flows.docs_numbers) -->\n"
        "<!-- end of generated: quick-time -->\n"
    )
    assert "No benchmark run is recorded yet" in rendered(page.read_text(), tmp_path)
    write_quick_run(tmp_path / "results" / "quick" / "smoke.json", _run("smoke", cells))
    smoke = rendered(page.read_text(), tmp_path)
    assert "No quick run is recorded yet" in smoke and "**smoke** run" in smoke
    assert "| neural_laplace | **0.125** (paper 0.0014 ± 0.0005) |" in smoke
    quick = _run("quick", cells)
    write_quick_run(tmp_path / "results" / "quick" / "quick.json", quick)
    assert read_quick_run(tmp_path / "results" / "quick" / "quick.json") == quick
    text = rendered(page.read_text(), tmp_path)
    assert "smoke" not in text and "| node | 0.25 (paper 0.073 ± 0.0016) |" in text
    assert "took 10 min (600 s) from command to prompt on a CPU, its load not recorded (2" in text
    assert "2 cells trained at commit `0123456789`" in text
    loaded = dataclasses.replace(quick, load="3.1, 4.0, 4.2")
    write_quick_run(tmp_path / "results" / "quick" / "quick.json", loaded)
    assert "on a CPU, at load 3.1, 4.0, 4.2 (2 cells" in rendered(page.read_text(), tmp_path)
    again = dataclasses.replace(cells[1], commit="fedcba9876543210", hardware="another CPU")
    mixed = dataclasses.replace(quick, cells=(cells[0], again))
    write_quick_run(tmp_path / "results" / "quick" / "quick.json", mixed)
    assert (
        "2 cells trained (1 at commit `0123456789` on some CPU; 1 at commit `fedcba9876` on "
        "another CPU), the command on a CPU"
    ) in rendered(page.read_text(), tmp_path)


def test_the_suite_time_is_the_latest_timed_runs_tests_with_the_range_of_its_runs(tmp_path):
    from tasks.reports.measurements import record_measurement

    page = tmp_path / "page.md"
    page.write_text(
        "<!-- generated: suite-time (python -m flows.docs_numbers) -->\n"
        "<!-- end of generated: suite-time -->\n"
    )
    folder = tmp_path / "results" / "measurements"
    head = ("command (make test)", "wall time", "tests", "load before", "load after")
    old = ("`pytest -q`", "6 min 1 s (361 s)", "1047 passed", "3.6, 3.8, 4.5", "2.0, 2.7, 3.8")
    record_measurement("suite_time", "t", "suite_time.py --record", head, [old], "", folder)
    text = rendered(page.read_text(), tmp_path)
    assert "took 6 min (361 s) in its one timed run, on " in text
    assert "at load 2.0 to 4.5 (" in text and ": 1047 passed." in text
    new = ("`pytest -q`", "20 min 19 s (1219 s)", "1428 passed", "4.1, 6.0, 8.2", "7.9, 6.2, 5.5")
    rows = [(*new, "abcdef0123"), (*old, "6f40ae5d20")]
    record_measurement(
        "suite_time", "t", "suite_time.py --record", (*head, "commit"), rows, "", folder
    )
    text = rendered(page.read_text(), tmp_path)
    assert "took 6 min (361 s) to 20 min (1219 s) over its last 2 timed runs" in text
    assert "at load 2.0 to 8.2 (" in text and "commit `abcdef0123`: 1428 passed." in text


def test_a_bad_record_is_named_in_one_line(tmp_path):
    bad = tmp_path / "quick.json"
    bad.write_text('{"profile": "quick", "cells": [{"system": "x"}]}')
    with pytest.raises(RecordError, match=r"quick.json: not a recorded run: test_rmse must be"):
        read_quick_run(bad)


def test_record_benchmark_writes_each_finished_cell_from_the_store(tmp_path):
    from tasks.config import resolve_config
    from tasks.ledger.quick_record import record_benchmark
    from tasks.tracking import RunRecord

    config = resolve_config(
        "smoke", None, {"systems": ["integro_de"], "methods": ["node", "anode"]}
    )
    node, anode = config.cells()
    tags = {"mlflow.source.git.commit": "abc", "numerics.model": "fm", "numerics.system": "fs"}
    record = RunRecord("run1", node.config_hash(), 0.5, tags, {"test_rmse": 0.5, "epochs_run": 2})

    class Store:  # the one query the writer asks
        def finished_cells(self, hashes):
            assert set(hashes) == {node.config_hash(), anode.config_hash()}
            return {node.config_hash(): record}

    run = record_benchmark(
        tmp_path / "r.json",
        config,
        Store(),
        parent_run_id="p",
        wall_seconds=12.34,
        flow_seconds=10.0,
        cells_trained=1,
        cells_reused=0,
    )
    assert read_quick_run(tmp_path / "r.json") == run
    (cell,) = run.cells  # anode has no finished run: left out
    assert (cell.method, cell.test_rmse, cell.epochs, cell.run_id) == ("node", 0.5, 2, "run1")
    assert cell.config_hash == node.config_hash() and run.wall_seconds == 12.3
