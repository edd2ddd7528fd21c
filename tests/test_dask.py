"""Scale-out on Dask: the smoke benchmark on a local 2-worker cluster (threads) gives the same
per-cell test RMSE as the default thread runner; runner construction and setup checks."""

from __future__ import annotations

import pytest
import torch

from flows import run_benchmark
from flows.runtime._dask import DaskSetupError, check_cluster_tracking, dask_task_runner
from tasks.config import resolve_config
from tasks.tracking import TrackingSettings, connect


def _config(runner: str):
    return resolve_config(
        "smoke",
        overrides={
            "systems": ["integro_de", "spiral_dde"],
            "methods": ["neural_laplace", "node"],
            "progress": False,
            "max_workers": 2,
            "task_runner": runner,
            "tracking": {"register_models": False},
        },
    )


@pytest.mark.heavy  # a Dask cluster and a Prefect server beside a benchmark
def test_dask_runner_gives_the_same_results(tmp_path, point_mlflow_at, prefect_server):
    torch.set_num_threads(1)
    results = {}
    for runner in ("thread", "dask"):
        # Separate stores: in one store the second run would reuse the first run's cells.
        point_mlflow_at(tmp_path / runner)
        summary = run_benchmark(_config(runner))
        assert summary.ok and summary.count("finished") == 4, [r.error for r in summary.results]
        results[runner] = {r.key: r.test_rmse for r in summary.results}
        # Workers logged to the configured store: every cell has its child run there.
        children = connect().queries.child_runs(summary.parent_run_id)
        assert len(children) == 4
    assert results["dask"].keys() == results["thread"].keys()
    for key, rmse in results["thread"].items():
        assert results["dask"][key] == pytest.approx(rmse, rel=1e-12, abs=1e-12), key


def test_local_cluster_uses_threads_and_addresses_are_checked():
    runner = dask_task_runner(3)
    assert runner.cluster_kwargs["processes"] is False
    assert runner.cluster_kwargs["n_workers"] == 3
    assert dask_task_runner(2, "tcp://10.0.0.5:8786").address == "tcp://10.0.0.5:8786"
    with pytest.raises(DaskSetupError, match="tcp://HOST:8786"):
        dask_task_runner(2, "10.0.0.5")


@pytest.mark.parametrize(
    "address",
    ["10.0.0.5", "bogus", "tcp://h", "tcp://h:0", "tcp://h:99999", "tcp://:8786", "http://h:80"],
)
def test_a_scheduler_address_that_is_not_one_is_refused_in_the_config(address):
    """Refused when the config is read, before any cell (also when every cell is reused)."""
    from tasks.config import ConfigError, resolve_config

    with pytest.raises(ConfigError, match=r"dask_address: must be a scheduler address"):
        resolve_config("smoke", None, {"dask_address": address})
    with pytest.raises(DaskSetupError, match=r"^--dask-address must be a scheduler address"):
        dask_task_runner(2, address)


@pytest.mark.parametrize("address", ["tcp://10.0.0.5:8786", "tls://[::1]:1", "inproc://x/1"])
def test_scheduler_addresses_of_each_scheme_are_taken(address):
    from tasks.config import resolve_config

    assert (
        resolve_config("smoke", None, {"dask_address": address}).execution.dask_address == address
    )


def test_remote_cluster_needs_a_reachable_tracking_store():
    embedded = TrackingSettings("sqlite:////tmp/x/mlflow.db", "/tmp/x/artifacts", "nllab")
    server = TrackingSettings("http://mlflow.internal:5000", None, "nllab")
    with pytest.raises(DaskSetupError, match="MLflow server"):
        check_cluster_tracking("tcp://10.0.0.5:8786", embedded)
    check_cluster_tracking(None, embedded)  # local threads: fine
    # A cluster's worker processes need a Prefect server to report to.
    with pytest.warns(UserWarning, match="PREFECT_API_URL"):
        check_cluster_tracking("tcp://127.0.0.1:8786", embedded)  # same machine: store reachable
    with pytest.warns(UserWarning, match="PREFECT_API_URL"):
        check_cluster_tracking("tcp://10.0.0.5:8786", server)
