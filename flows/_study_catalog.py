"""The paper's studies by command-line name: title and the paper's table or figure.

Loads without Prefect or torch, so that ``nllab study --help`` lists the studies at once; each
study's :class:`~flows.studies.StudySpec` reads its title and reference from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["ABLATIONS", "STUDY_CATALOG", "StudyEntry", "study_entry"]


@dataclass(frozen=True)
class StudyEntry:
    name: str
    title: str
    paper_ref: str
    #: its factor can be re-run from a registered model (``nllab reproduce --ablation NAME``)
    ablation: bool = False
    #: the seeds the paper averages this study over at its budget (the reference code's
    #: ``--seed 0 --run_number_of_seeds n`` runs seeds 0..n-1); None: the profile's own five
    paper_seeds: tuple[int, ...] | None = None

    @property
    def module(self) -> str:
        """The module that defines the study: named after it (``latent-dim``:
        ``flows.studies.latent_dim``)."""
        return f"flows.studies.{self.name.replace('-', '_')}"

    @property
    def paper_label(self) -> str:
        """The paper's table or figure, short: ``paper_ref`` up to its first bracket."""
        return self.paper_ref.split(" (", 1)[0].split(";", 1)[0]


#: Study name (as ``nllab study NAME``) -> entry, in the paper's order.
STUDY_CATALOG = MappingProxyType(
    {
        e.name: e
        for e in (
            StudyEntry(
                "stereographic",
                "Stereographic map ablation",
                "Table 5 (Table:ablate): stereographic projection off/on",
                ablation=True,
            ),
            StudyEntry(
                "latent-dim",
                "Latent size K of Neural Laplace",
                "Table 5 (Table:ablate): latent dimension K on Lotka–Volterra, stiff Van der Pol, "
                "piecewise forcing and the integro-DE",
                ablation=True,
            ),
            StudyEntry(
                "noise",
                "Noisy observations",
                "Table:AdditionalNoiseResult (σ = 0.1, 3 seeds)",
                ablation=True,
                paper_seeds=(0, 1, 2),
            ),
            StudyEntry(
                "sample-size",
                "Sample size N",
                "Table:datascaling (Lotka–Volterra, 200 epochs, 3 seeds)",
                paper_seeds=(0, 1, 2),
            ),
            StudyEntry(
                "observation-size",
                "Observation size (stiff Van der Pol, σ = 0.01)",
                "Figure ObservationSizeScaling (200 epochs, 5 seeds; figure only)",
            ),
            StudyEntry(
                "ilt",
                "ILT algorithms",
                "Table 12 (ILTtimeres, RMSE of cos t) and figure ILTcompar (training loss, "
                "FSI vs CME, 3 seeds)",
                ablation=True,
                paper_seeds=(0, 1, 2),
            ),
            StudyEntry(
                "solvers",
                "ODE solver of the baselines",
                "Table 10 (Table:AdditionalMSE, dopri5); euler from Table 3",
            ),
            StudyEntry(
                "nfe",
                "NFEs to extrapolate",
                "Figure nfes_analysis (Appendix NFEplots; figure only: NL one g evaluation per "
                "set of query times, NODE ≈1000× more at Δt = 100)",
            ),
            StudyEntry(
                "wallclock",
                "Seconds per training epoch (Lotka–Volterra)",
                "Table 11 (wallclocktime; 1000 trajectories, V100 GPU)",
            ),
            StudyEntry(
                "cmi",
                "Conditional mutual information (true; predicted | initial condition)",
                "Table:CMI (5 seeds, higher is better)",
            ),
            StudyEntry(
                "waveforms",
                "Toy waveforms",
                "Table:toywaveforms (5 seeds)",
            ),
            StudyEntry(
                "frequency-filter",
                "Low-pass Neural Laplace on a corrupted signal",
                "Appendix C (frequencyfilter) figure: the filtered model recovers the clean signal",
            ),
        )
    }
)

#: Studies whose factor ``nllab reproduce --ablation`` re-runs, in the paper's order.
ABLATIONS: tuple[str, ...] = tuple(e.name for e in STUDY_CATALOG.values() if e.ablation)


def study_entry(name: str) -> StudyEntry:
    """The catalog's entry of study ``name``; an unknown name raises ``ValueError`` listing the
    valid ones."""
    if name not in STUDY_CATALOG:
        raise ValueError(f"unknown study {name!r}; valid studies: {', '.join(STUDY_CATALOG)}")
    return STUDY_CATALOG[name]
