"""The paper's five baselines (Neural Laplace paper, Appendix D), registered by name.

Importing this package registers ``node``, ``anode``, ``latent_ode``, ``nf_coupling`` and
``nf_resnet`` in :data:`nlmodels.model_registry.MODELS`.
"""

from nlmodels.baselines._solve import ADAPTIVE_SOLVERS
from nlmodels.baselines.latent_ode import LatentODE
from nlmodels.baselines.neural_flows import CouplingFlow, NFCoupling, NFResNet, ResNetFlow
from nlmodels.baselines.ode import ANODE, NODE, REFERENCE_TOLERANCES

__all__ = [
    "ADAPTIVE_SOLVERS",
    "ANODE",
    "NODE",
    "REFERENCE_TOLERANCES",
    "CouplingFlow",
    "LatentODE",
    "NFCoupling",
    "NFResNet",
    "ResNetFlow",
]
