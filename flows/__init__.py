"""Prefect flows of Neural Laplace Lab and the ``nllab`` command line. Importing this package
changes nothing in the process: the flow modules, which load Prefect, apply the platform's
settings first (:mod:`tasks.offline`).

The benchmark, reproduction, tuning and the documentation's figures are at the top; the rest
are rooms with one face each: :mod:`.cli` (the command line), :mod:`.studies`, :mod:`.ledger`,
:mod:`.reports`, :mod:`.serve` and :mod:`.runtime` (Prefect's settings and servers, Dask,
artifacts, the environment's faults)."""

__all__ = ["BenchmarkSummary", "benchmark_flow", "registry_name", "run_benchmark"]


def __getattr__(name: str):
    # Loaded on first use (PEP 562): ``import flows.cli`` must not start Prefect.
    if name in __all__:
        from flows import benchmark

        return getattr(benchmark, name)
    raise AttributeError(f"module 'flows' has no attribute {name!r}")
