"""Neural Laplace Lab models: ILT algorithms, the stereographic map, Neural Laplace, baselines.

    from nlmodels import build_model, MODELS, NeuralLaplace, get_ilt
    model = build_model("neural_laplace", state_dim=2)  # or node, anode, latent_ode, nf_coupling,
    y = model(obs_t, obs_x, query_t)                     # nf_resnet; y is [B, T_q, D]

Pure torch: this package never imports prefect, mlflow or optuna. Importing it changes nothing
in the process and loads nothing heavy (names load on first use, PEP 562: the registry, with
every built-in model, on the first registry name); call :func:`set_up_numerics` first to get the
CPU numerics the platform's runs use (the same bytes on every x86-64 CPU with AVX2 and FMA; see
:mod:`nlmodels.numerics`).
"""

from __future__ import annotations

from nlmodels.lazy import lazy_face

#: The module that defines each public name.
_WHERE = {
    name: module
    for module, names in {
        "nlmodels._cpu": "numerics_environment",
        "nlmodels.numerics": "NumericsError NumericsSetup cpu_mode_in_effect numerics_downgrade "
        "numerics_in_effect numerics_note numerics_tag on_numerics_effect require_numerics "
        "set_up_numerics",
        "nlmodels.accel.native": "native_cpu_kernels",
        "nlmodels.accel.portable": "portable_cpu_kernels",
        "nlmodels.base": "ForecastModel",
        "nlmodels.ilt": "ILT_ALGORITHMS ILTAlgorithm get_ilt",
        "nlmodels.model_registry": "MODELS build_model model_signature non_default_overrides "
        "register_model",
        "nlmodels.neural_laplace": "NeuralLaplace",
        "nlmodels.stereographic": "from_sphere to_sphere",
    }.items()
    for name in names.split()
}
#: Public names under another name in their module.
_ALIASES = {
    "native_cpu_kernels": "native_enabled",
    "native_build": "build_info",
    "portable_cpu_kernels": "installed",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_face(__name__, _WHERE, _ALIASES)
