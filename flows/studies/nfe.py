"""``nllab study nfe``: function evaluations to extrapolate, Neural Laplace vs NODE/ANODE with
dopri5 (paper figure ``nfes_analysis``, Appendix ``NFEplots``).

Models are trained on the piecewise-forcing ODE (cells through the platform, reused when
finished), then, as in the paper, (a) extrapolate one point Δt after the last observation
(t = 10) for Δt up to 100, and (b) extrapolate N points on the fixed horizon (10, 20]. Part (a)
reuses ``benchmarks/models.py`` (``horizon_nfe``), which excludes the encoder's evaluations.

The NFEs are the trained model's (the same bits, the same count), so the results ledger keeps
them with each cell's record, as the curves :data:`MEASURE` (NFE against Δt) and ``nfe_points``
(NFE against N) that :func:`nfe_of_run` measures; the Neural Laplace cells are Table 3's. The
seconds each extrapolation takes are the machine's, not the model's: not recorded.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.studies._core import Study, StudyContext, StudyOutput, StudySpec, run_model
from flows.studies._plots import plot_lines
from flows.studies._tables import add_paper, aggregate
from tasks.cell import prepare_cell, simulate_data
from tasks.config import CellConfig
from tasks.ledger.measured import Measured
from tasks.results import CellResult
from tasks.tracking import Queries

DTS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
N_POINTS = (1, 10, 100, 1000)
METHODS = ("neural_laplace", "node", "anode")
#: The curve each record carries: NFE against Δt (and ``nfe_points``: NFE against N).
MEASURE = "nfe_horizon"
POINTS = "nfe_points"
#: Test trajectories extrapolated (the paper's figure is of one batch).
TRAJECTORIES = 8
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
def measure_nfe(model, obs_t: np.ndarray, obs_x: np.ndarray, dts: tuple, points: tuple) -> Measured:
    """The curves of (a) NFE against Δt and (b) NFE against N points."""
    from nlmodels import diagnostics as bench

    t = torch.tensor(np.array(obs_t), dtype=torch.float64)
    x = torch.tensor(np.array(obs_x), dtype=torch.float64)
    model = model.double()
    horizon = tuple((float(dt), float(bench.horizon_nfe(model, t, x, dt))) for dt in dts)
    count = tuple((float(n), float(_nfe_points(model, t, x, n, 10.0))) for n in points)
    return Measured(curves={MEASURE: horizon, POINTS: count})


def nfe_of_run(
    cell: CellConfig,
    run_id: str,
    queries: Queries,
    cache_dir: Path | None = None,
    dts: tuple[float, ...] = DTS,
    points: tuple[int, ...] = N_POINTS,
) -> Measured:
    """The NFE curves of the model that ``cell`` trained (its MLflow run ``run_id``), from the
    first :data:`TRAJECTORIES` test trajectories' observations (``cache_dir``: the data cache,
    None: simulated afresh, the same data either way)."""
    model, _ = run_model(queries, run_id)
    test = prepare_cell(cell, simulate_data(cell.system, cell.data, cell.seed, cache_dir)).test
    obs_x = np.asarray(test.obs_x)[:TRAJECTORIES]
    # (the task's function: the ledger measures in the engine's hook, outside a flow, as CMI)
    return measure_nfe.fn(model, np.asarray(test.obs_t), obs_x, tuple(dts), tuple(points))


def _table(rows: list[dict], keys: tuple[str, str], index: list[tuple]) -> pd.DataFrame:
    """Mean, std and n over seeds per key, a row for each of ``index`` (n = 0 where nothing is
    measured); no published figure (the paper plots these)."""
    placeholders = [{**dict(zip(keys, k, strict=True)), "value": math.nan} for k in index]
    return add_paper(aggregate([*placeholders, *rows], keys), keys, SPEC.paper)


def _body(ctx: StudyContext) -> StudyOutput:
    """Figure nfes_analysis: NFEs against Δt and against the number of query points."""
    system = ctx.systems(("piecewise_forcing_ode",))[0]
    methods = ctx.methods(METHODS)
    dts = ctx.pick(smoke=(1.0, 10.0, 100.0), quick=DTS, paper=DTS)
    points = ctx.pick(smoke=(1, 10, 100), quick=N_POINTS, paper=N_POINTS)
    cells = [
        ctx.cell(system, m, seed, model={} if m == "neural_laplace" else ctx.ode_solver("dopri5"))
        for m in methods
        for seed in ctx.seeds
    ]
    results: list[CellResult] = ctx.run_cells(cells)
    horizon, count = [], []
    for cell, r in zip(cells, results, strict=True):

        def of_run(cell: CellConfig = cell, run_id: str = r.run_id or "") -> Measured:
            return nfe_of_run(cell, run_id, ctx.queries, ctx.runtime.cache_dir, dts, points)

        measured = ctx.measured(r, of_run)
        curves = measured.curves
        horizon += [{"method": cell.method, "dt": dt, "value": v}
                    for dt, v in curves.get(MEASURE, ()) if dt in dts]  # fmt: skip
        count += [{"method": cell.method, "n_points": int(n), "value": v}
                  for n, v in curves.get(POINTS, ()) if n in points]  # fmt: skip
    tables = {
        "nfe_horizon": _table(horizon, ("method", "dt"), [(m, dt) for m in methods for dt in dts]),
        "nfe_points": _table(
            count, ("method", "n_points"), [(m, n) for m in methods for n in points]
        ),
    }
    plot_lines(tables["nfe_horizon"], "dt", "method", ctx.figure("nfe_horizon"), ylabel="NFE",
               title="(a) NFE to extrapolate Δt ahead", logx=True, logy=True)  # fmt: skip
    plot_lines(tables["nfe_points"], "n_points", "method", ctx.figure("nfe_points"), ylabel="NFE",
               title="(b) NFE for N points on (10, 20]", logx=True, logy=True)  # fmt: skip
    return StudyOutput(tables)


STUDY = Study(SPEC, _body, measure=nfe_of_run)
