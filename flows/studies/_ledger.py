"""The paper's other tables in the results ledger: each study's cells, planned by its own body,
and its tables and figures drawn again from the ledger's records.

A study's body is the one place that says which cells its table needs (``nllab study NAME``
trains them through :meth:`StudyContext.run_cells`). Here the same body runs twice more without
training anything:

* **planned** (:func:`planned_cells`): its context collects the cells it asks for and hands back
  "not trained" results, so the ledger lists exactly the cells the study would train at the
  profile's budget (:func:`ledger_study_cells`; :class:`tasks.ledger.StudyCells` for the ledger's
  scope);
* **recorded** (:func:`recorded_output`): its context answers each cell with the ledger's record
  of its config hash (a study cell that is a Table 3 cell is answered by Table 3's record) and
  each measurement with what the record measured, so the table and figures are those the study
  would draw, from the records.

What a study measures of a trained model beyond its test RMSE is recorded with the cell: numbers
(the CMI of ``Table:CMI``) and short curves (the training loss per epoch that figure
``ILTcompar`` draws, the NFEs of ``nfes_analysis``): :data:`MEASURES` names the one a record must
have, :meth:`StudyContext.measured` computes them, and ``nllab ledger run`` records them with the
cell (:func:`measure_cell`), from the run it just made.

What a study measures without training anything (the ILT algorithms' accuracy and speed of
Table 12, the seconds per epoch of Table 11) is no cell's result: a timing is the machine's. Its
table is a committed measurement instead (``results/measurements/NAME.json``,
:data:`MEASUREMENTS`, written by ``benchmarks/study_measurements.py --record`` through
:func:`study_measurements`), drawn with the hardware it was measured on.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows._study_catalog import study_entry
from flows.studies._config import study_config
from tasks.config import CellConfig
from tasks.ledger.measured import Measured
from tasks.reports.measurements import FOLDER, Measurement, read_measurement
from tasks.results import CellResult
from tasks.tracking import Metrics

if TYPE_CHECKING:
    import pandas as pd

    from flows.studies._core import Study, StudyContext, StudyOutput
    from tasks.ledger import LedgerRecord
    from tasks.ledger.scope import StudyCells
    from tasks.tracking import Queries

__all__ = [
    "LEDGER_STUDIES",
    "MEASUREMENTS",
    "MEASURES",
    "RecordedOutput",
    "StudyPlan",
    "ledger_study_cells",
    "measure_cell",
    "measurement_frame",
    "measurement_rows",
    "plan_study",
    "planned_cells",
    "recorded_output",
    "study_cells",
    "study_measurements",
]

#: The studies whose tables the ledger keeps, in the order ``ledger run`` gives each its first
#: complete seed: the paper's tables, the cheapest first (``results/measurements/
#: study_projection.json``), so that as many tables as possible have a figure early; then its
#: figures (ILTcompar, frequencyfilter, nfes_analysis), which measure trained models, the
#: cheapest first, and Table 11 (wall clock), which trains nothing. The stereographic ablation is
#: the ledger's own (:data:`tasks.ledger.ABLATIONS`).
LEDGER_STUDIES: tuple[str, ...] = (
    "sample-size",
    "latent-dim",
    "observation-size",
    "cmi",
    "waveforms",
    "noise",
    # NODE and ANODE with dopri5 at the reference's tolerances: the costliest first seed
    "solvers",
    "ilt",
    "frequency-filter",
    "nfe",
    "wallclock",
)

#: What a record of a study's cell must have measured besides its test RMSE (a number of
#: ``measures`` or a curve of ``curves``: :meth:`tasks.ledger.Measured.has`), as records name it:
#: each study module's ``MEASURE``.
MEASURES: Mapping[str, str] = {
    "cmi": "cmi_bits",
    "ilt": "train_loss",
    "frequency-filter": "corruption_amplitude",
    "nfe": "nfe_horizon",
}

#: The tables a study measures without training (:meth:`StudyContext.measurement`): the
#: committed records ``results/measurements/NAME.json`` that its ledger table is drawn from.
MEASUREMENTS: Mapping[str, tuple[str, ...]] = {
    "ilt": ("ilt_accuracy",),
    "wallclock": ("wallclock",),
}

_HERE = Path(__file__).resolve().parent


def _study(name: str) -> Study:
    """(:func:`flows.studies.get_study`, which this module's face imports it for.)"""
    return import_module(study_entry(name).module).STUDY


def _context(
    name: str, profile: str, folder: Path, kind: type[StudyContext], **settings: Any
) -> StudyContext:
    """A context of ``kind`` for study ``name`` at ``profile`` (``settings``: more of
    :func:`~flows.studies.study_config`'s), without a store or a parent run."""
    study = _study(name)
    config = study_config(name, profile, **settings)
    return kind(config, study.spec, None, f"ledger:{name}", None, folder)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StudyPlan:
    """The cells a study's body asks for, each once, in its order; ``stopped``: why the body
    ended before its end (a measurement study measures trained models after asking for its
    cells: planned, there are none), None when it ran through."""

    cells: tuple[CellConfig, ...]
    stopped: str | None = None


def plan_study(name: str, profile: str = "paper") -> StudyPlan:
    """Study ``name``'s cells at ``profile``'s budget: its body run with a context that collects
    the cells it asks for and trains none (each handed back "not trained")."""
    from flows.studies._core import StudyContext

    @dataclass(frozen=True)
    class Planning(StudyContext):
        planned: list[CellConfig] = field(default_factory=list)

        def run_cells(self, cells: Sequence[CellConfig]) -> list[CellResult]:
            self.planned.extend(cells)
            return [CellResult.failed(c, "failed", "planned, not trained") for c in cells]

        def figure(self, name: str) -> Path:  # (nothing to look at yet)
            return self.folder / f"{name}.png"

        def measurement(self, name: str, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
            import pandas as pd  # (here: the command line's parser loads this module)

            return pd.DataFrame()  # (a timing is measured, not planned)

    stopped = None
    with tempfile.TemporaryDirectory(prefix="nllab-plan-") as tmp:
        ctx = _context(name, profile, Path(tmp), Planning)
        try:
            _study(name).body(ctx)
        except Exception as e:  # (its cells before the measurement count)
            stopped = f"{type(e).__name__}: {e}"
    planned = ctx.planned  # type: ignore[attr-defined]
    return StudyPlan(tuple({c.config_hash(): c for c in planned}.values()), stopped)


def planned_cells(name: str, profile: str = "paper") -> list[CellConfig]:
    """The cells study ``name`` trains at ``profile``'s budget, in its body's order, each once
    (:func:`plan_study`); a body that cannot be planned through raises ``RuntimeError``."""
    plan = plan_study(name, profile)
    if plan.stopped is not None:
        raise RuntimeError(f"study {name!r} cannot be planned through: {plan.stopped}")
    return list(plan.cells)


def ledger_study_cells(profile: str) -> list[tuple[str, str, CellConfig]]:
    """``(study, measure, cell)`` for every cell of :data:`LEDGER_STUDIES` at ``profile``'s
    budget (``measure``: :data:`MEASURES`' name, "" for the test RMSE alone)."""
    return [
        (name, MEASURES.get(name, ""), cell)
        for name in LEDGER_STUDIES
        for cell in planned_cells(name, profile)
    ]


def study_cells() -> StudyCells:
    """The ledger's view of the studies (:class:`tasks.ledger.StudyCells`): their cells and
    the sources that define them (the studies' modules and the catalog)."""
    from tasks.ledger.scope import StudyCells

    return StudyCells(ledger_study_cells, (_HERE, _HERE.parent / "_study_catalog.py"))


# -- drawn from the records ---------------------------------------------------------------------
@dataclass(frozen=True)
class RecordedOutput:
    """A study's tables and figures drawn from the ledger's records: ``figures`` maps each
    figure's name to its PNG bytes; ``cells``/``recorded``: the cells its body asked for and
    how many of them the ledger answered; ``measurements``: the committed measurement of each
    table it measures without training (None: not measured yet)."""

    output: StudyOutput
    figures: Mapping[str, bytes]
    cells: int
    recorded: int
    measurements: Mapping[str, Measurement | None] = field(default_factory=dict)


def recorded_output(
    name: str,
    records: Sequence[LedgerRecord],
    profile: str = "paper",
    measurements: Path = FOLDER,
) -> RecordedOutput:
    """Study ``name``'s tables and figures at ``profile``'s budget from ``records`` (the counted
    record of each cell's config hash; a cell without one, or without the study's measure, is
    "not recorded yet" and shows as missing) and, for what it measures without training, from
    the committed records in the folder ``measurements`` (:data:`MEASUREMENTS`)."""
    from flows.studies._core import StudyContext

    measure = MEASURES.get(name, "")
    by_hash: dict[str, LedgerRecord] = {}
    for r in records:  # (the counted ones: the caller's selection; later lines win)
        if not measure or r.measured.has(measure):
            by_hash[r.config_hash] = r
    asked: dict[str, bool] = {}
    read: dict[str, Measurement | None] = {}

    @dataclass(frozen=True)
    class Recorded(StudyContext):
        def run_cells(self, cells: Sequence[CellConfig]) -> list[CellResult]:
            out = []
            for c in cells:
                h = c.config_hash()
                r = by_hash.get(h)
                asked[h] = r is not None
                if r is None:
                    out.append(CellResult.failed(c, "failed", "not recorded yet"))
                else:
                    out.append(CellResult.recorded(c, r.run_id, _metrics(r), r.test_rmse))
            return out

        def measured(self, result: CellResult, compute: Callable[[], Measured]) -> Measured:
            r = by_hash.get(result.config_hash or "")
            return Measured() if r is None else r.measured

        def measurement(self, table: str, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
            path = measurements / f"{table}.json"
            read[table] = found = read_measurement(path) if path.is_file() else None
            if found is not None:
                return measurement_frame(found)
            import pandas as pd

            return pd.DataFrame()

    with tempfile.TemporaryDirectory(prefix=f"nllab-ledger-{name}-") as tmp:
        ctx = _context(name, profile, Path(tmp), Recorded)
        output = _study(name).body(ctx)
        figures = {p.stem: p.read_bytes() for p in sorted((Path(tmp) / "figures").glob("*.png"))}
    return RecordedOutput(output, figures, len(asked), sum(asked.values()), read)


def _metrics(record: LedgerRecord) -> dict[str, float]:
    """A record's final metrics under the names its run logged them."""
    named = {
        "test_top_share": record.top_share,
        Metrics.TEST_RMSE_WITHOUT_TOP: record.rmse_without_top,
        Metrics.TRAIN_SECONDS: record.train_seconds,
    }
    return {k: v for k, v in named.items() if v is not None}


def measure_cell(study: str, cell: CellConfig, run_id: str, queries: Queries) -> Measured:
    """What ``study`` measures of ``cell``'s trained model (its MLflow run ``run_id``), as the
    ledger records it (:data:`MEASURES`; nothing for a study that measures nothing more).
    Raises ``ValueError`` when the study's measure lacks what its records must have."""
    measure, measured = MEASURES.get(study), _study(study).measure
    if measure is None or measured is None:
        return Measured()
    out = measured(cell, run_id, queries)
    if not out.has(measure):
        raise ValueError(f"study {study!r} measured no {measure!r} of run {run_id}")
    return out


# -- measured without training -----------------------------------------------------------------
def study_measurements(
    name: str,
    profile: str = "paper",
    *,
    seeds: Sequence[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, pd.DataFrame]:
    """What study ``name`` measures without training at ``profile``'s budget (``seeds``,
    ``overrides``: as :func:`~flows.studies.study_config` takes them), measured now
    (:meth:`StudyContext.measurement`): table name -> its frame. Its body runs with no cell
    trained (each handed back "not trained"), so only the measurements take time."""
    from flows.studies._core import StudyContext

    measured: dict[str, pd.DataFrame] = {}

    @dataclass(frozen=True)
    class Measuring(StudyContext):
        def run_cells(self, cells: Sequence[CellConfig]) -> list[CellResult]:
            return [CellResult.failed(c, "failed", "not trained: measuring") for c in cells]

        def measurement(self, table: str, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
            measured[table] = compute()
            return measured[table]

    from prefect.settings import PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW, temporary_settings

    # The body's Prefect tasks run here without a flow: their log lines stay local, unwarned.
    quiet = temporary_settings({PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "ignore"})
    with quiet, tempfile.TemporaryDirectory(prefix=f"nllab-measure-{name}-") as tmp:
        ctx = _context(name, profile, Path(tmp), Measuring, seeds=seeds, overrides=overrides)
        _study(name).body(ctx)
    return measured


def measurement_frame(m: Measurement) -> pd.DataFrame:
    """A committed measurement's table as a frame, its numbers numbers again (the record keeps
    them as text: :func:`measurement_rows`)."""
    import pandas as pd

    frame = pd.DataFrame(list(m.rows), columns=list(m.columns))
    for column in frame.columns:
        try:
            frame[column] = pd.to_numeric(frame[column])
        except (ValueError, TypeError):
            try:  # ("nan" among numbers, which pandas does not parse but float does)
                frame[column] = [float(v) for v in frame[column]]
            except ValueError:
                pass  # (a column of names)
    return frame


def measurement_rows(frame: pd.DataFrame) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """A measured table as a measurement record keeps it (:func:`tasks.reports.
    record_measurement`): its columns, and its rows as text, numbers to 6 significant digits."""

    def text(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    rows = [tuple(text(v) for v in row) for row in frame.itertuples(index=False)]
    return tuple(map(str, frame.columns)), rows
