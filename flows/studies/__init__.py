"""Every study of the paper as a Prefect flow tracked in MLflow.

    from flows.studies import run_study, study_config
    summary = run_study(study_config("noise", "smoke"))

:data:`STUDIES` maps the command-line names to :class:`~flows.studies._core.Study` objects (spec +
flow); :func:`get_study` raises a ``ValueError`` listing the valid names for an unknown one.
:data:`LEDGER_STUDIES` are the studies whose tables the results ledger keeps at the paper's
budget (their cells planned, and their tables drawn from the records, by their own bodies:
:mod:`flows.studies._ledger`); what they measure without training (timings, :data:`MEASUREMENTS`)
is drawn from committed measurements instead (:func:`study_measurements` measures it).
"""

from __future__ import annotations

from importlib import import_module
from types import MappingProxyType
from typing import TYPE_CHECKING

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from flows._study_catalog import STUDY_CATALOG, study_entry
from flows.studies._config import StudyConfig, study_config

if TYPE_CHECKING:
    from collections.abc import Mapping

    from flows.studies._core import Factor, Study, StudyContext, StudySpec, StudySummary
    from flows.studies._ledger import (
        LEDGER_STUDIES,
        MEASUREMENTS,
        MEASURES,
        RecordedOutput,
        StudyPlan,
        ledger_study_cells,
        measure_cell,
        measurement_frame,
        measurement_rows,
        plan_study,
        planned_cells,
        recorded_output,
        study_cells,
        study_measurements,
    )

    #: Study name (as ``nllab study NAME``) -> study, in the catalog's (the paper's) order.
    STUDIES: Mapping[str, Study]

__all__ = [
    "LEDGER_STUDIES",
    "MEASUREMENTS",
    "MEASURES",
    "STUDIES",
    "Factor",
    "RecordedOutput",
    "Study",
    "StudyConfig",
    "StudyContext",
    "StudyPlan",
    "StudySpec",
    "StudySummary",
    "check_study_name",
    "get_study",
    "ledger_study_cells",
    "measure_cell",
    "measurement_frame",
    "measurement_rows",
    "plan_study",
    "planned_cells",
    "recorded_output",
    "run_study",
    "study_cells",
    "study_config",
    "study_measurements",
]

_CORE = ("Factor", "Study", "StudyContext", "StudySpec", "StudySummary")


# The studies (Prefect flows, torch) load on first use (PEP 562): a schedules file or the
# command line checks a study's name and configuration without loading them.
def __getattr__(name: str):
    if name == "STUDIES":
        value = MappingProxyType({n: get_study(n) for n in STUDY_CATALOG})
    elif name in _CORE:
        value = getattr(import_module("flows.studies._core"), name)
    elif name in __all__:  # the rest of the face: the studies in the results ledger
        value = getattr(import_module("flows.studies._ledger"), name)
    else:
        raise AttributeError(f"module 'flows.studies' has no attribute {name!r}")
    globals()[name] = value
    return value


def check_study_name(name: str) -> None:
    """A ``ValueError`` listing the valid studies when ``name`` is none of them."""
    study_entry(name)


def get_study(name: str) -> Study:
    """The study called ``name``; an unknown name raises ``ValueError`` with the valid ones."""
    return import_module(study_entry(name).module).STUDY


def run_study(config: StudyConfig) -> StudySummary:
    """Run the study named by ``config.study`` (its flow, with a capped task runner)."""
    return get_study(config.study).run(config)
