"""Prefect flows of Neural Laplace Lab and the ``nllab`` command line."""

from flows.benchmark import BenchmarkSummary, benchmark_flow, registry_name, run_benchmark

__all__ = ["BenchmarkSummary", "benchmark_flow", "registry_name", "run_benchmark"]
