"""Every study of the paper as a Prefect flow tracked in MLflow.

    from flows.studies import run_study, study_config
    summary = run_study(study_config("noise", "smoke"))

:data:`STUDIES` maps the command-line names to :class:`~flows.studies._core.Study` objects (spec +
flow); :func:`get_study` raises a ``ValueError`` listing the valid names for an unknown one.
"""

from __future__ import annotations

from importlib import import_module
from types import MappingProxyType

from flows._study_catalog import STUDY_CATALOG
from flows.studies._config import StudyConfig, study_config
from flows.studies._core import Study, StudyContext, StudySpec, StudySummary

__all__ = [
    "STUDIES",
    "Study",
    "StudyConfig",
    "StudyContext",
    "StudySpec",
    "StudySummary",
    "get_study",
    "run_study",
    "study_config",
]

#: Study name (as ``nllab study NAME``) -> study, in the catalog's (the paper's) order; each
#: study lives in the module named after it (``latent-dim``: ``flows.studies.latent_dim``).
STUDIES = MappingProxyType(
    {name: import_module(f"flows.studies.{name.replace('-', '_')}").STUDY for name in STUDY_CATALOG}
)


def get_study(name: str) -> Study:
    """The study called ``name``; an unknown name raises ``ValueError`` with the valid ones."""
    try:
        return STUDIES[name]
    except KeyError:
        raise ValueError(f"unknown study {name!r}; valid studies: {', '.join(STUDIES)}") from None


def run_study(config: StudyConfig) -> StudySummary:
    """Run the study named by ``config.study`` (its flow, with a capped task runner)."""
    return get_study(config.study).run(config)
