"""``nllab report --out DIR`` shares DIR with the user: it writes and replaces only its own files
(listed with their hashes in the manifest), never deletes anything else, and refuses to replace a
file it did not write unless forced."""

from __future__ import annotations

import hashlib
import json

import pytest

from flows.reports.report_full import MANIFEST, UnownedFiles, build_report
from tasks.results import CellResult
from tasks.tracking import connect

RESULTS = [
    CellResult("integro_de", m, s, "finished", 0.01 * (i + 1) + 0.001 * s, f"r{i}{s}")
    for i, m in enumerate(("node", "neural_laplace"))
    for s in (0, 1)
]


def _report(out, force=False):
    return build_report(connect().queries, out, results=RESULTS, profile="smoke", force=force)


def test_report_never_deletes_or_silently_overwrites_user_files(mlflow_store, tmp_path):
    out = tmp_path / "shared"
    (out / "figures").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    (out / "figures" / "mine.png").write_bytes(b"my figure")
    (out / "report.html").write_text("<p>my own report</p>")

    with pytest.raises(UnownedFiles) as e:
        _report(out)
    assert e.value.paths == (out / "report.html",) and "--force" in str(e.value)
    assert (out / "report.html").read_text() == "<p>my own report</p>"
    assert not (out / "results.md").exists() and not (out / MANIFEST).exists()  # nothing written

    paths = _report(out, force=True)
    assert "Neural Laplace Lab" in paths.html.read_text()
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "figures" / "mine.png").read_bytes() == b"my figure"

    # its own files: replaced freely on the next run
    _report(out)
    # an edited one is the user's again
    (out / "results.md").write_text("edited")
    with pytest.raises(UnownedFiles) as e:
        _report(out)
    assert e.value.paths == (out / "results.md",)
    assert (out / "results.md").read_text() == "edited"


def test_report_removes_only_its_own_unchanged_stale_files(mlflow_store, tmp_path):
    out = tmp_path / "r"
    _report(out)
    manifest = json.loads((out / MANIFEST).read_text())
    stale, edited = out / "figures" / "old.png", out / "figures" / "older.png"
    stale.write_bytes(b"old")
    edited.write_bytes(b"older, then edited")
    manifest["files"]["figures/old.png"] = hashlib.sha256(b"old").hexdigest()
    manifest["files"]["figures/older.png"] = hashlib.sha256(b"older").hexdigest()
    (out / MANIFEST).write_text(json.dumps(manifest))
    _report(out)
    assert not stale.exists()  # ours, unchanged, no longer part of the report
    assert edited.read_bytes() == b"older, then edited"  # changed since: left alone


def test_report_reads_the_latest_finished_parent_only(mlflow_store, tmp_path):
    """A newer benchmark parent that was killed (no results, no config) is skipped."""
    from flows.reports.report_full import benchmark_config
    from tasks.config import resolve_config

    tracker = connect()
    config = resolve_config("smoke", None, {"systems": ["integro_de"]})
    with tracker.runs.run(
        "benchmark-smoke", {"nllab.kind": "benchmark", "profile": "smoke"}
    ) as done:
        tracker.runs.log_text(done, config.model_dump_json(), "run_config.json")
    killed = tracker.runs.create_run(
        "benchmark-quick", {"nllab.kind": "benchmark", "profile": "quick"}
    )
    tracker.runs.end_run(killed, "KILLED")
    running = tracker.runs.create_run("benchmark-paper", {"nllab.kind": "benchmark"})  # never ended
    assert running
    found, run_id = benchmark_config(tracker.queries)
    assert run_id == done and found == config
    paths = build_report(tracker.queries, tmp_path / "r")  # no "Failed to download artifacts"
    assert f"parent run {done}" in paths.markdown.read_text()
