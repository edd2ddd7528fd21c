"""``nllab ui`` as a real server: the REST API lists the benchmark's child runs with their
``model.*`` params, a second UI on the same port fails, SIGTERM stops the server with it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _wait_health(address: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            with urllib.request.urlopen(f"{address}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the MLflow UI did not answer on {address}")


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _what_a_browser_sees(url: str) -> dict[str, str]:
    """The text of the runs page at ``url`` and of the experiment's Models tab, in headless
    chromium (Debian's, as the report's browser test; skipped where it is not installed)."""
    from playwright.sync_api import sync_playwright

    models = url.split("/runs?")[0] + "/models?workflowType=machine_learning"
    seen = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1700, "height": 1000})
            for key, address, text in (("runs", url, "test_rmse"), ("models", models, "-s0")):
                page.goto(address)
                page.get_by_text(text).first.wait_for(timeout=60_000)
                seen[key] = page.inner_text("body")
        finally:
            browser.close()
    return seen


def _nllab(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.heavy  # the UI server and a benchmark behind it
def test_ui_serves_the_benchmark_and_refuses_a_busy_port(mlflow_store, prefect_server):
    from flows.benchmark import run_benchmark
    from flows.cli.ui import port_in_use
    from tasks.config import resolve_config

    config = resolve_config(
        "smoke",
        None,
        {
            "systems": ["integro_de"],
            "methods": ["node", "neural_laplace"],
            "training": {"epochs": 1},
            "isolation": "thread",
            "progress": False,
        },
    )
    summary = run_benchmark(config)
    assert summary.ok
    port = _free_port()
    address = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = _nllab("ui", "--port", str(port), "--no-browser", env=env)
    try:
        _wait_health(address, first)
        exp = json.loads(
            urllib.request.urlopen(
                f"{address}/api/2.0/mlflow/experiments/get-by-name?experiment_name=nllab",
                timeout=30,
            ).read()
        )["experiment"]["experiment_id"]
        runs = _post(
            f"{address}/api/2.0/mlflow/runs/search",
            {
                "experiment_ids": [exp],
                "filter": f"tags.`mlflow.parentRunId` = '{summary.parent_run_id}'",
            },
        )["runs"]
        assert len(runs) == 2
        for run in runs:
            params = {p["key"]: p["value"] for p in run["data"]["params"]}
            method = params["method"]
            assert params["model.state_dim"] == "1"
            if method == "node":
                assert params["model.hidden"] == "[128, 128]" and params["model.solver"]
            else:
                assert params["model.terms"] == "33" and params["model.ilt"] == "fourier"
        # the Models tab's source: one logged model per cell, its test_rmse linked to it
        models = _post(f"{address}/api/2.0/mlflow/logged-models/search", {"experiment_ids": [exp]})[
            "models"
        ]
        assert len(models) == 2
        for m in models:
            assert "test_rmse" in {x["key"] for x in m["data"]["metrics"]}
            assert m["info"]["source_run_id"] in {r["info"]["run_id"] for r in runs}
        opened = first.stdout.readline() + first.stdout.readline()
        assert "viewStateShareKey=nllab-results" in opened, opened
        if Path(CHROMIUM).exists() and importlib.util.find_spec("playwright"):
            seen = _what_a_browser_sees(opened.split("open ")[1].split()[0])
            assert "test_rmse" in seen["runs"]  # a column of the saved view
            assert "node-integro_de-s0" in seen["models"]  # the Models tab, one per cell
            assert "neural_laplace-integro_de-s0" in seen["models"]
        # a second UI on the same port: a clear refusal, not a silent "open …"
        second = _nllab("ui", "--port", str(port), "--no-browser", env=env)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2, (out, err)
        assert f"cannot serve on 127.0.0.1:{port}" in err and "--port" in err
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=60)
    assert f"#/experiments/{exp}/runs?viewStateShareKey=nllab-results&workflowType=" in opened
    assert opened.startswith("nllab ui: starting the MLflow UI")  # said before it answers
    assert "Warning" not in err and "Registry store URI not provided" not in err, err
    assert "Security middleware" not in err, err  # MLflow's start-up chatter, left out
    assert first.returncode != 0  # stopped by the signal
    # the server it started is gone with it: the port is free again (a poll that ends as soon as
    # it is; a minute, as a loaded machine may take seconds to end a server)
    deadline = time.monotonic() + 60
    while port_in_use("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert port_in_use("127.0.0.1", port) is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{address}/health", timeout=5)


def test_ui_opens_the_model_training_view_with_the_results_in_view(mlflow_store):
    """The experiment is marked model-training (the UI's classic sidebar, also on a run's page)
    and a saved view of its run table shows test_rmse; the command names the registry store (no
    "not provided" notice) and keeps its libraries' deprecation warnings out."""
    from flows.cli.ui import runs_view_url, ui_command, ui_environment
    from tasks.tracking import UI_VIEW_KEY, connect

    tracker = connect()
    tags = tracker.store.client.get_experiment(tracker.experiment_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"  # from creation on
    assert tracker.queries.set_ui_view() == UI_VIEW_KEY
    tags = tracker.store.client.get_experiment(tracker.experiment_id).tags
    view = json.loads(tags[f"mlflow.sharedViewState.{UI_VIEW_KEY}"])
    assert "metrics.`test_rmse`" in view["selectedColumns"]
    assert view["columnOrder"] == view["selectedColumns"]
    # the chart view opens on test RMSE by system and method, in a section of its own
    (section,) = view["compareRunSections"]
    parallel, bar = view["compareRunCharts"]
    assert parallel["type"] == "PARALLEL" and parallel["selectedMetrics"] == ["test_rmse"]
    assert parallel["selectedParams"] == ["system", "method"]
    assert bar["type"] == "BAR" and bar["metricKey"] == "test_rmse"
    assert parallel["metricSectionId"] == bar["metricSectionId"] == section["uuid"]
    url = runs_view_url("http://127.0.0.1:5000", tracker.experiment_id, UI_VIEW_KEY)
    assert url.endswith(f"runs?viewStateShareKey={UI_VIEW_KEY}&workflowType=machine_learning")
    cmd, _ = ui_command("127.0.0.1", 5000)
    store = cmd[cmd.index("--backend-store-uri") + 1]
    assert cmd[cmd.index("--registry-store-uri") + 1] == store
    warnings = ui_environment()["PYTHONWARNINGS"].split(",")
    assert "ignore:starlette.middleware.wsgi is deprecated" in warnings
