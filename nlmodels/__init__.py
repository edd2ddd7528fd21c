"""Neural Laplace Lab models: ILT algorithms, the stereographic map, Neural Laplace, baselines.

    from nlmodels import build_model, MODELS, NeuralLaplace, get_ilt
    model = build_model("neural_laplace", state_dim=2)  # or node, anode, latent_ode, nf_coupling,
    y = model(obs_t, obs_x, query_t)                     # nf_resnet; y is [B, T_q, D]

Pure torch: this package never imports prefect, mlflow or optuna.
"""

# First: MKL's reproducible mode must be set before torch's first matrix product.
from nlmodels import _numerics  # noqa: F401
from nlmodels import baselines as _baselines  # noqa: F401  (registers the baseline models)
from nlmodels.accel.native import native_enabled as native_cpu_kernels
from nlmodels.base import ForecastModel
from nlmodels.ilt import ILT_ALGORITHMS, ILTAlgorithm, get_ilt
from nlmodels.model_registry import (
    MODELS,
    build_model,
    load_builtin_models,
    model_arguments,
    model_choices,
    model_option_types,
    model_signature,
    non_default_overrides,
    register_model,
)
from nlmodels.neural_laplace import NeuralLaplace
from nlmodels.stereographic import from_sphere, to_sphere

load_builtin_models()  # every model of nlmodels/models.toml, registered by its own module

__all__ = [
    "ILT_ALGORITHMS",
    "MODELS",
    "ForecastModel",
    "ILTAlgorithm",
    "NeuralLaplace",
    "build_model",
    "from_sphere",
    "get_ilt",
    "model_arguments",
    "model_choices",
    "model_option_types",
    "model_signature",
    "native_cpu_kernels",
    "non_default_overrides",
    "register_model",
    "to_sphere",
]
