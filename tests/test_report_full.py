"""``nllab report``: one self-contained HTML and a Markdown report of the latest study
runs, read back from MLflow, each table beside the paper's figures with the gap marked."""

from __future__ import annotations

import base64
import re

import pytest

from tasks.reports.verdict import VERDICT_RULE

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_report_from_store(mlflow_store, tmp_path):
    import torch

    from flows.reports.report_full import build_report
    from flows.studies import STUDIES, run_study, study_config
    from tasks.tracking import connect

    torch.set_num_threads(1)
    run_study(study_config("stereographic", "smoke"))
    summary = run_study(study_config("ilt", "smoke"))
    tracker = connect()
    paths = build_report(tracker.queries, tmp_path / "report")

    page = paths.html.read_text()
    md = paths.markdown.read_text()
    # Self-contained: every figure embedded as a decodable PNG, no external references.
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3  # stereographic + ilt accuracy + ilt training loss
    assert all(base64.b64decode(b)[:4] == b"\x89PNG" for b in images)
    assert "http://" not in page and "https://" not in page
    # Only the studies that ran have a section; one line lists the rest with their commands.
    ran = {"stereographic", "ilt"}
    for name in STUDIES:
        assert (f"<code>{name}</code>" in page) == (name in ran)
        assert (f"(`{name}`)" in md) == (name in ran)
        assert (f"`nllab study {name}`" in md) == (name not in ran)
    assert "No run yet" not in md and md.count("Not run yet: ") == 1
    assert "`nllab benchmark`" in md and "## Main table" not in md
    assert summary.parent_run_id in md
    # Our number beside the paper's, the gap marked.
    assert "| algorithm | value | std | n | paper | gap | verdict |" in md
    assert VERDICT_RULE in md and VERDICT_RULE in page  # the legend states the one rule
    assert re.search(r"\| fourier \| 0\.017\d+ \| – \| 1 \| 0\.0171 \| [-0-9.e]+ \| ✓ match \|", md)
    assert "▼ worse" in md  # smoke-trained stereographic models are far from the paper
    assert "background:#dbe9ff" in page  # a coloured match row
    assert len(paths.figures) == 3 and all(p.is_file() for p in paths.figures)
    assert all(f"figures/{p.name}" in md for p in paths.figures)


def test_report_of_empty_store(mlflow_store, tmp_path):
    from flows.reports.report_full import build_report
    from tasks.tracking import connect

    paths = build_report(connect().queries, tmp_path)
    md = paths.markdown.read_text()
    assert "\n## " not in md and "No run yet" not in md  # no empty sections
    (line,) = [x for x in md.splitlines() if x.startswith("Not run yet: ")]
    assert line.count("`nllab ") == 14  # the benchmark, 12 studies, tuning
    assert "<h2>" not in paths.html.read_text()


def test_empty_tuning_section_suggests_a_command_that_parses(mlflow_store, tmp_path):
    from flows.cli import build_parser
    from flows.reports.report_full import TUNE_EXAMPLE, build_report
    from tasks.tracking import connect

    args = build_parser().parse_args(TUNE_EXAMPLE.split()[1:])
    args.precheck(args)  # its names are valid too
    assert (args.command, args.trials) == ("tune", 10)
    paths = build_report(connect().queries, tmp_path)
    assert f"<code>{TUNE_EXAMPLE}</code>" in paths.html.read_text()


def test_runs_table_says_trained_for_the_benchmarks_own_cells(mlflow_store, tmp_path):
    """A cell run that is a child of the latest finished benchmark was trained by it; a cell
    found from an earlier benchmark was reused. The HTML caption names no terminal."""
    from flows.reports.report_full import build_report, stored_cell_results
    from tasks.config import resolve_config
    from tasks.reports.reporting import results_table
    from tasks.tracking import connect

    selection = {"systems": ["integro_de"], "methods": ["node", "anode"]}
    config = resolve_config("smoke", None, selection)
    node, anode = config.cells()
    t = connect()
    tags = {"nllab.kind": "benchmark", "profile": "smoke"}
    earlier = t.runs.create_run("benchmark-smoke", tags)
    t.runs.end_run(earlier, "FINISHED")
    latest = t.runs.create_run("benchmark-smoke", tags)
    for cell, parent in ((node, latest), (anode, earlier)):
        run = t.runs.create_run(
            cell.key, {"nllab.kind": "cell", "config_hash": cell.config_hash()}, parent
        )
        t.runs.log_metrics(run, {"test_rmse": 0.5})
        t.runs.end_run(run, "FINISHED")
    t.runs.end_run(latest, "FINISHED")

    results = stored_cell_results(t.queries, config)
    assert [r.status for r in results] == ["finished", "reused"]
    page = build_report(t.queries, tmp_path, results=results, profile="smoke").html.read_text()
    runs = page[page.index("<th>status</th>") :]
    assert "<td>trained</td>" in runs and "<td>reused</td>" in runs
    assert "in a terminal" not in page and "best per system in bold" in page
    text = " ".join(results_table(results, profile="smoke").to_terminal().split())  # unwrapped
    assert "best per system marked *" in text


def test_report_judges_the_main_table_in_the_paper_profile_only(mlflow_store, tmp_path):
    from flows.reports.report_full import build_report
    from tasks.reports.reporting import PAPER_BUDGET
    from tasks.results import CellResult
    from tasks.tracking import connect

    # Far above the paper's 0.0730 ± 0.0016 and 0.0014 ± 0.0005 on integro: ▼ when judged.
    results = [
        CellResult("integro_de", m, 0, "finished", v, f"run-{m}")
        for m, v in (("node", 0.5), ("anode", 0.4))
    ]
    pages = {
        p: build_report(connect().queries, tmp_path / p, results=results, profile=p)
        for p in ("quick", "paper")
    }
    quick = pages["quick"].html.read_text()
    main = quick[quick.index("<h3>results</h3>") : quick.index("<h3>ranking</h3>")]
    assert "▼" not in main and "background:" not in main and "(paper 0.073" not in main
    assert "paper 0.073 ± 0.0016" in main and f"another budget ({PAPER_BUDGET})" in main
    assert "▼" not in (tmp_path / "quick" / "results.md").read_text()
    paper = pages["paper"].html.read_text()
    main = paper[paper.index("<h3>results</h3>") : paper.index("<h3>ranking</h3>")]
    assert main.count('class="mark">▼') == 2 and "background:#ffd9d9" in main
