"""``nllab study nfe``: function evaluations (and wall time) to extrapolate, Neural Laplace vs
NODE/ANODE with dopri5 (paper figure ``nfes_analysis``, Appendix ``NFEplots``).

Models are trained on the piecewise-forcing ODE (cells through the platform, reused when
finished), then, as in the paper, (a) extrapolate one point Δt after the last observation
(t = 10) for Δt up to 100, and (b) extrapolate N points on the fixed horizon (10, 20]. Part (a)
reuses ``benchmarks/models.py`` (``horizon_nfe``), which excludes the encoder's evaluations.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec
from flows.studies._plots import plot_lines
from tasks.results import CellResult

DTS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
N_POINTS = (1, 10, 100, 1000)
METHODS = ("neural_laplace", "node", "anode")
SPEC = StudySpec(
    name="nfe",
    metric="NFE",
)


def _nfe_points(model, obs_t: torch.Tensor, obs_x: torch.Tensor, n: int, horizon: float) -> int:
    """NFEs (decoder only) to predict ``n`` points evenly on (t_last, t_last + horizon]."""
    from nlmodels.diagnostics import decoder_nfe

    t_last = float(obs_t[-1])
    query = torch.linspace(t_last, t_last + horizon, n + 1, dtype=obs_t.dtype)[1:]
    return decoder_nfe(model, obs_t, obs_x, query)


@task(name="nfe-measure", cache_policy=NO_CACHE)
def measure_nfe(
    model, method: str, obs_t: np.ndarray, obs_x: np.ndarray, dts: tuple, points: tuple
) -> tuple[list[dict], list[dict]]:
    """Rows of (a) NFE/seconds against Δt and (b) NFE/seconds against N points."""
    from nlmodels import diagnostics as bench

    t = torch.tensor(np.array(obs_t), dtype=torch.float64)
    x = torch.tensor(np.array(obs_x), dtype=torch.float64)
    model = model.double()
    horizon, count = [], []
    for dt in dts:
        t0 = time.perf_counter()
        nfe = bench.horizon_nfe(model, t, x, dt)
        horizon.append(
            {"method": method, "dt": dt, "value": nfe, "seconds": time.perf_counter() - t0}
        )
    for n in points:
        t0 = time.perf_counter()
        nfe = _nfe_points(model, t, x[:8], n, 10.0)
        count.append({"method": method, "n_points": n, "value": nfe,
                      "seconds": time.perf_counter() - t0})  # fmt: skip
    return horizon, count


def _table(rows: list[dict], keys: tuple[str, ...]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    g = frame.groupby(list(keys), sort=False)
    out = g.agg(value=("value", "mean"), std=("value", "std"), n=("value", "size"),
                seconds=("seconds", "mean")).reset_index()  # fmt: skip
    out["std"] = out["std"].fillna(0.0)
    out["paper"], out["gap"], out["verdict"] = math.nan, math.nan, "–"
    return out[[*keys, "value", "std", "n", "paper", "gap", "verdict", "seconds"]]


def _body(ctx: StudyContext) -> StudyOutput:
    """Figure nfes_analysis: NFEs against Δt and against the number of query points."""
    system = ctx.systems(("piecewise_forcing_ode",))[0]
    methods = ctx.methods(METHODS)
    dts = ctx.pick(smoke=(1.0, 10.0, 100.0), quick=DTS, paper=DTS)
    points = ctx.pick(smoke=(1, 10, 100), quick=N_POINTS, paper=N_POINTS)
    cells = [
        ctx.cell(system, m, seed, model={} if m == "neural_laplace" else {"solver": "dopri5"})
        for m in methods
        for seed in ctx.seeds
    ]
    results: list[CellResult] = ctx.run_cells(cells)
    horizon, count = [], []
    for cell, r in zip(cells, results, strict=True):
        if not r.ok:
            continue
        model, _ = ctx.load_model(r)
        split = ctx.prepared(cell).test
        h, c = measure_nfe(model, cell.method, split.obs_t, split.obs_x[:8], dts, points)
        horizon += h
        count += c
    tables = {
        "nfe_horizon": _table(horizon, ("method", "dt")),
        "nfe_points": _table(count, ("method", "n_points")),
    }
    plot_lines(tables["nfe_horizon"], "dt", "method", ctx.figure("nfe_horizon"), ylabel="NFE",
               title="(a) NFE to extrapolate Δt ahead", logx=True, logy=True)  # fmt: skip
    plot_lines(tables["nfe_points"], "n_points", "method", ctx.figure("nfe_points"), ylabel="NFE",
               title="(b) NFE for N points on (10, 20]", logx=True, logy=True)  # fmt: skip
    return StudyOutput(tables)


STUDY = Study(SPEC, _body)
