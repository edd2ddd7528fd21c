"""``nllab ui`` as a real server: the REST API lists the benchmark's child runs with their
``model.*`` params, a second UI on the same port fails, SIGTERM stops the server with it."""

from __future__ import annotations

import json
import os
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


def _nllab(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


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
        # a second UI on the same port: a clear refusal, not a silent "open …"
        second = _nllab("ui", "--port", str(port), "--no-browser", env=env)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2, (out, err)
        assert f"cannot serve on 127.0.0.1:{port}" in err and "--port" in err
    finally:
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=60)
    assert f"#/experiments/{exp}/runs?workflowType=machine_learning" in out
    assert first.returncode != 0  # stopped by the signal
    # the server it started is gone with it: the port is free again
    deadline = time.monotonic() + 20
    while port_in_use("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert port_in_use("127.0.0.1", port) is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{address}/health", timeout=5)
