"""The paper's studies by command-line name: title and the paper's table or figure.

Loads without Prefect or torch, so that ``nllab study --help`` lists the studies at once; each
study's :class:`~flows.studies.StudySpec` reads its title and reference from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["ABLATIONS", "STUDY_CATALOG", "StudyEntry"]


@dataclass(frozen=True)
class StudyEntry:
    name: str
    title: str
    paper_ref: str
    #: its factor can be re-run from a registered model (``nllab reproduce --ablation NAME``)
    ablation: bool = False


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
                "Table 5 (Table:ablate): latent dimension K on Lotka–Volterra",
                ablation=True,
            ),
            StudyEntry(
                "noise",
                "Noisy observations",
                "Table:AdditionalNoiseResult (σ = 0.1, 3 seeds)",
                ablation=True,
            ),
            StudyEntry(
                "sample-size",
                "Sample size N",
                "Table:datascaling (Lotka–Volterra, 200 epochs, 3 seeds)",
            ),
            StudyEntry(
                "observation-size",
                "Observation size (stiff Van der Pol, σ = 0.01)",
                "Figure ObservationSizeScaling (200 epochs, 5 seeds; figure only)",
            ),
            StudyEntry(
                "ilt",
                "ILT algorithms",
                "Table 12 (ILTtimeres, RMSE of cos t) and figure ILTcompar (training loss)",
                ablation=True,
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
