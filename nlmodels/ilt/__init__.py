"""Inverse Laplace transform algorithms (Neural Laplace, Appendix B), batched and in float64.

    from nlmodels.ilt import get_ilt
    ilt = get_ilt("fourier", terms=33)
    x = ilt.invert(F, t)                    # or: ilt.reconstruct(F(ilt.query(t)), t)

Names: ``fourier`` (FSI, default), ``dehoog``, ``talbot``, ``stehfest``, ``cme``, ``euler``.
"""

from nlmodels.ilt._base import ILT_ALGORITHMS, ILTAlgorithm, get_ilt
from nlmodels.ilt._fourier import DeHoog, FourierSeries
from nlmodels.ilt._scaled import CME, Euler, FixedTalbot, Stehfest, cme_parameters

__all__ = [
    "CME",
    "ILT_ALGORITHMS",
    "DeHoog",
    "Euler",
    "FixedTalbot",
    "FourierSeries",
    "ILTAlgorithm",
    "Stehfest",
    "cme_parameters",
    "get_ilt",
]
