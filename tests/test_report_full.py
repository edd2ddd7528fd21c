"""``nllab report``: one self-contained HTML and a Markdown report of the latest study
runs, read back from MLflow, each table beside the paper's figures with the gap marked."""

from __future__ import annotations

import base64
import re

import pytest

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_report_from_store(mlflow_store, tmp_path):
    import torch

    from flows.report_full import build_report
    from flows.studies import STUDIES, run_study, study_config
    from tasks.tracking import Tracker

    torch.set_num_threads(1)
    run_study(study_config("stereographic", "smoke"))
    summary = run_study(study_config("ilt", "smoke"))
    tracker = Tracker.connect()
    paths = build_report(tracker, tmp_path / "report")

    page = paths.html.read_text()
    md = paths.markdown.read_text()
    # Self-contained: every figure embedded as a decodable PNG, no external references.
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3  # stereographic + ilt accuracy + ilt training loss
    assert all(base64.b64decode(b)[:4] == b"\x89PNG" for b in images)
    assert "http://" not in page and "https://" not in page
    # Every study has a section; those never run say how to run them.
    for name in STUDIES:
        assert f"<code>{name}</code>" in page and f"(`{name}`)" in md
    assert "nllab study noise" in md and "nllab benchmark" in md
    assert summary.parent_run_id in md
    # Our number beside the paper's, the gap marked.
    assert "| algorithm | value | std | n | paper | gap | verdict |" in md
    assert re.search(r"\| fourier \| 0\.017\d+ \| – \| 1 \| 0\.0171 \| [-0-9.e]+ \| ✓ match \|", md)
    assert "▼ worse" in md  # smoke-trained stereographic models are far from the paper
    assert "background:#dbe9ff" in page  # a coloured match row
    assert len(paths.figures) == 3 and all(p.is_file() for p in paths.figures)
    assert all(f"figures/{p.name}" in md for p in paths.figures)


def test_report_of_empty_store(mlflow_store, tmp_path):
    from flows.report_full import build_report
    from tasks.tracking import Tracker

    paths = build_report(Tracker.connect(), tmp_path)
    assert "No run yet" in paths.html.read_text()
    assert paths.markdown.read_text().count("_No run yet") == 14  # benchmark, 12 studies, tuning


def test_empty_tuning_section_suggests_a_command_that_parses(mlflow_store, tmp_path):
    from flows.cli import build_parser
    from flows.report_full import TUNE_EXAMPLE, build_report
    from tasks.tracking import Tracker

    args = build_parser().parse_args(TUNE_EXAMPLE.split()[1:])
    args.precheck(args)  # its names are valid too
    assert (args.command, args.trials) == ("tune", 10)
    paths = build_report(Tracker.connect(), tmp_path)
    assert f"<code>{TUNE_EXAMPLE}</code>" in paths.html.read_text()


def test_runs_table_says_trained_for_the_benchmarks_own_cells(mlflow_store, tmp_path):
    """A cell run that is a child of the latest finished benchmark was trained by it; a cell
    found from an earlier benchmark was reused. The HTML caption names no terminal."""
    from flows.report_full import build_report, stored_cell_results
    from tasks.config import resolve_config
    from tasks.reporting import results_table
    from tasks.tracking import Tracker

    selection = {"systems": ["integro_de"], "methods": ["node", "anode"]}
    config = resolve_config("smoke", None, selection)
    node, anode = config.cells()
    t = Tracker.connect()
    earlier = t.create_run("benchmark-smoke", {"nllab.kind": "benchmark"})
    t.end_run(earlier, "FINISHED")
    latest = t.create_run("benchmark-smoke", {"nllab.kind": "benchmark"})
    for cell, parent in ((node, latest), (anode, earlier)):
        run = t.create_run(
            cell.key, {"nllab.kind": "cell", "config_hash": cell.config_hash()}, parent
        )
        t.log_metrics(run, {"test_rmse": 0.5})
        t.end_run(run, "FINISHED")
    t.end_run(latest, "FINISHED")

    results = stored_cell_results(t, config)
    assert [r.status for r in results] == ["finished", "reused"]
    page = build_report(t, tmp_path, results=results).html.read_text()
    runs = page[page.index("<th>status</th>") :]
    assert "<td>trained</td>" in runs and "<td>reused</td>" in runs
    assert "in a terminal" not in page and "best per system in bold" in page
    assert "best per system marked *" in results_table(results).to_terminal()
