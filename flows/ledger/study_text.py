"""The paper's other tables in the ledger as people read them: a line per study for ``nllab
ledger status`` (:func:`study_lines`), and each study's tables drawn from its records for
``nllab ledger table --study NAME`` (:func:`study_tables`), with the committed measurement of
what a study times rather than trains (:func:`measurement_phrase`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tasks.ledger import LedgerRecord, LedgerStatus

__all__ = ["made_by", "measurement_phrase", "study_lines", "study_tables"]


def study_lines(status: LedgerStatus, measurements: Path | None = None) -> list[str]:
    """One line per study of the selection (the paper's other tables): ``<study> (<the paper's
    table>): N of M selected cells recorded``, how many of them are Table 3's own cells, whose
    records serve both, and the committed measurement of each table it times rather than trains
    (in the folder ``measurements``, default ``results/measurements``)."""
    from flows._study_catalog import STUDY_CATALOG
    from tasks.config.names import MAIN_SYSTEMS

    lines = []
    for study in status.studies:
        states = status.study_states(study)
        timed = measurement_phrase(study, measurements)
        if not states:
            label = STUDY_CATALOG[study].paper_label
            lines.append(f"{study} ({label}): no cell to train, its table is timed: {timed}")
            continue
        n = Counter(s.state for s in states)
        # a cell at the profile's own config on one of Table 3's systems is Table 3's cell (the
        # toy waveforms' cells are at the profile's config too, on systems of their own)
        shared = sum(
            not s.cell.ablation and not s.cell.measure and s.cell.system in MAIN_SYSTEMS
            for s in states
        )
        measured = {s.cell.measure for s in states if s.cell.measure}
        parts = [f"{n['missing']} missing"]
        if n["predates"]:
            parts.append(f"{n['predates']} predating numerics fingerprints (not counted)")
        if n["other_config"]:
            parts.append(f"{n['other_config']} recorded under another config only")
        if shared:
            parts.append(f"{shared} are Table 3's own cells (one record serves both)")
        if measured:
            parts.append(f"each record with its {', '.join(sorted(measured))}")
        lines.append(
            f"{study} ({STUDY_CATALOG[study].paper_label}): {n['recorded']} of {len(states)} "
            f"selected cells recorded ({'; '.join(parts)})" + (f"; {timed}" if timed else "")
        )
    return lines


def measurement_phrase(study: str, folder: Path | None = None) -> str:
    """Where the tables ``study`` measures without training come from (:data:`flows.studies.
    MEASUREMENTS`): each committed record with the machine and commit it was measured at, or
    the command that measures it; "" for a study that measures nothing so."""
    from flows.studies import MEASUREMENTS
    from tasks.reports import read_measurement
    from tasks.reports.measurements import FOLDER

    folder = FOLDER if folder is None else folder
    parts = []
    for name in MEASUREMENTS.get(study, ()):
        path = folder / f"{name}.json"
        if path.is_file():
            m = read_measurement(path)
            parts.append(
                f"{name} from results/measurements/{name}.json (measured on {m.machine}, "
                f"commit {m.commit})"
            )
        else:
            parts.append(
                f"{name} not measured yet (`PYTHONPATH=. python benchmarks/study_measurements.py "
                f"--record --studies {study}`)"
            )
    return "; ".join(parts)


def study_tables(
    status: LedgerStatus,
    fmt: Literal["terminal", "markdown"],
    *,
    profile: str = "paper",
    figures: Path | None = None,
) -> str:
    """Each study of the selection's tables, drawn from its counted records by the study's own
    body (:func:`flows.studies.recorded_output`), with its count of recorded cells; its figures
    are written to the folder ``figures`` (``STUDY-NAME.png``) when given, and named."""
    from flows.studies import recorded_output
    from tasks.reports import Table, render_table

    parts = []
    for study in status.studies:
        states = status.study_states(study)
        counted = [s.record for s in states if s.state == "recorded" and s.record is not None]
        drawn = recorded_output(study, counted, profile)
        for name, frame in drawn.output.tables.items():
            title = f"{study}: {name}" if name != study.replace("-", "_") else study
            parts.append(f"{title}\n\n{render_table(Table.from_frame(frame), fmt).rstrip()}")
        if states:
            parts.append(
                f"{len(counted)} of the {len(states)} selected cells of {study} recorded. "
                f"Made by: {made_by(counted)}."
            )
        if timed := measurement_phrase(study):
            parts.append(f"Timed, not trained: {timed}.")
        if figures is not None:
            figures.mkdir(parents=True, exist_ok=True)
            for name, png in drawn.figures.items():
                (figures / f"{study}-{name}.png").write_bytes(png)
                parts.append(f"Figure: {figures / f'{study}-{name}.png'}")
    return "\n\n".join(parts)


def made_by(records: Sequence[LedgerRecord]) -> str:
    """``3 on cpu (Intel Xeon); 1 on cuda (H200)``: what made ``records``."""
    made = Counter(f"{r.device or '?'} ({r.hardware or 'unknown'})" for r in records)
    return "; ".join(f"{n} on {what}" for what, n in sorted(made.items())) or "nothing yet"
