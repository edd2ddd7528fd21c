"""Neural Laplace Lab models: ILT algorithms, the stereographic map, Neural Laplace, baselines.

    from nlmodels import build_model, MODELS, NeuralLaplace, get_ilt
    model = build_model("neural_laplace", state_dim=2)  # or node, anode, latent_ode, nf_coupling,
    y = model(obs_t, obs_x, query_t)                     # nf_resnet; y is [B, T_q, D]

Pure torch: this package never imports prefect, mlflow or optuna. Importing it changes nothing
in the process; call :func:`set_up_numerics` first to get the CPU numerics the platform's runs
use (the same bytes on every x86-64 CPU with AVX2 and FMA; see :mod:`nlmodels._numerics`).
"""

from nlmodels import baselines as _baselines  # noqa: F401  (registers the baseline models)
from nlmodels._numerics import (
    NumericsError,
    NumericsSetup,
    cpu_mode_in_effect,
    mkl_position_independent,
    numerics_in_effect,
    numerics_tag,
    require_numerics,
    set_up_numerics,
)
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
    "NumericsError",
    "NumericsSetup",
    "build_model",
    "cpu_mode_in_effect",
    "from_sphere",
    "get_ilt",
    "mkl_position_independent",
    "model_arguments",
    "model_choices",
    "model_option_types",
    "model_signature",
    "native_cpu_kernels",
    "non_default_overrides",
    "numerics_in_effect",
    "numerics_tag",
    "register_model",
    "require_numerics",
    "set_up_numerics",
    "to_sphere",
]
