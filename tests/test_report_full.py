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
