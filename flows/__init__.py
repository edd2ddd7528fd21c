"""Prefect flows of Neural Laplace Lab and the ``nllab`` command line."""

import tasks._env  # noqa: F401  (offline switches before mlflow/prefect load)

# isort: split
from flows.benchmark import BenchmarkSummary, benchmark_flow, registry_name, run_benchmark

__all__ = ["BenchmarkSummary", "benchmark_flow", "registry_name", "run_benchmark"]
