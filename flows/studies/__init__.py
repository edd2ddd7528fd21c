"""Every study of the paper as a Prefect flow tracked in MLflow.

    from flows.studies import run_study, study_config
    summary = run_study(study_config("noise", "smoke"))

:data:`STUDIES` maps the command-line names to :class:`~flows.studies._core.Study` objects (spec +
flow); :func:`get_study` raises a ``ValueError`` listing the valid names for an unknown one.
"""

from __future__ import annotations

from importlib import import_module
from types import MappingProxyType
from typing import TYPE_CHECKING

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

from flows._study_catalog import STUDY_CATALOG
from flows.studies._config import StudyConfig, study_config

if TYPE_CHECKING:
    from collections.abc import Mapping

    from flows.studies._core import Factor, Study, StudyContext, StudySpec, StudySummary

    #: Study name (as ``nllab study NAME``) -> study, in the catalog's (the paper's) order.
    STUDIES: Mapping[str, Study]

__all__ = [
    "STUDIES",
    "Factor",
    "Study",
    "StudyConfig",
    "StudyContext",
    "StudySpec",
    "StudySummary",
    "check_study_name",
    "get_study",
    "run_study",
    "study_config",
]

_CORE = ("Factor", "Study", "StudyContext", "StudySpec", "StudySummary")


def _module(name: str) -> str:
    """Each study lives in the module named after it (``latent-dim``: ``.latent_dim``)."""
    return f"flows.studies.{name.replace('-', '_')}"


# The studies (Prefect flows, torch) load on first use (PEP 562): a schedules file or the
# command line checks a study's name and configuration without loading them.
def __getattr__(name: str):
    if name == "STUDIES":
        value = MappingProxyType({n: import_module(_module(n)).STUDY for n in STUDY_CATALOG})
    elif name in _CORE:
        value = getattr(import_module("flows.studies._core"), name)
    else:
        raise AttributeError(f"module 'flows.studies' has no attribute {name!r}")
    globals()[name] = value
    return value


def check_study_name(name: str) -> None:
    """A ``ValueError`` listing the valid studies when ``name`` is none of them."""
    if name not in STUDY_CATALOG:
        raise ValueError(f"unknown study {name!r}; valid studies: {', '.join(STUDY_CATALOG)}")


def get_study(name: str) -> Study:
    """The study called ``name``; an unknown name raises ``ValueError`` with the valid ones."""
    check_study_name(name)
    return import_module(_module(name)).STUDY


def run_study(config: StudyConfig) -> StudySummary:
    """Run the study named by ``config.study`` (its flow, with a capped task runner)."""
    return get_study(config.study).run(config)
