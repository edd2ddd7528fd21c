"""A search space for a model the platform has none for (a plugin's): the model's own
``search_space(trial) -> dict`` hook if it has one, else a space derived from its constructor's
typed options around their defaults: a positive integer between a quarter and four times its
default (log scale), a positive float between a tenth and ten times, a flag or ``Literal``
among its values, layer widths as a width (as the integers) and a depth of 1 to 3; options of
any other kind keep their default. The learning rate is searched as for the built-in models."""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

import optuna

__all__ = ["derived_space"]


def _widths(default: Any) -> bool:
    return (
        isinstance(default, tuple | list)
        and len(default) > 0
        and all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in default)
    )


def _categorical(name: str, values: list[Any], trial: optuna.Trial) -> Any:
    return trial.suggest_categorical(name, values)


def _log_int(name: str, lo: int, hi: int, trial: optuna.Trial) -> int:
    return trial.suggest_int(name, lo, hi, log=True)


def _log_float(name: str, lo: float, hi: float, trial: optuna.Trial) -> float:
    return trial.suggest_float(name, lo, hi, log=True)


def _layer_widths(name: str, w: int, trial: optuna.Trial) -> tuple[int, ...]:
    """Layers of one width (a quarter to four times ``w``, log scale), 1 to 3 of them."""
    return (trial.suggest_int(f"{name}_width", max(1, w // 4), w * 4, log=True),) * (
        trial.suggest_int(f"{name}_depth", 1, 3)
    )


def _drawers(method: str) -> tuple[dict[str, Callable[[optuna.Trial], Any]], dict[str, Any]]:
    from nlmodels.model_registry import model_choices, model_option_types, model_signature

    hints, choices = model_option_types(method), model_choices(method)
    draws: dict[str, Callable[[optuna.Trial], Any]] = {}
    paper: dict[str, Any] = {}
    for name, default in model_signature(method).items():
        hint = hints.get(name)
        if name in choices:
            draws[name] = partial(_categorical, name, list(choices[name]))
        elif isinstance(default, bool) or hint is bool:
            draws[name] = partial(_categorical, name, [False, True])
        elif isinstance(default, int) and default > 0 and hint in (int, None):
            draws[name] = partial(_log_int, name, max(1, default // 4), default * 4)
        elif isinstance(default, float) and default > 0:
            draws[name] = partial(_log_float, name, default / 10, default * 10)
        elif _widths(default) and typing.get_origin(hint) in (Sequence, tuple, list, None):
            w = max(default)
            draws[name] = partial(_layer_widths, name, w)
            paper[f"{name}_width"], paper[f"{name}_depth"] = w, len(default)
            continue
        else:
            continue
        paper[name] = default
    return draws, paper


def derived_space(method: str) -> tuple[Callable[[optuna.Trial], Any], dict[str, Any]]:
    """``(draw, paper point)`` of ``method``: draw gives ``(model overrides, training
    overrides)``; the paper point is the model's defaults in trial-parameter form."""
    from nlmodels.model_registry import MODELS, find_model

    find_model(method)
    hook = getattr(MODELS[method], "search_space", None)
    if callable(hook):

        def draw_hook(trial: optuna.Trial) -> tuple[dict[str, Any], dict[str, float]]:
            lr = trial.suggest_float("lr", 1e-4, 3e-2, log=True)
            return dict(hook(trial)), {"lr": lr}

        return draw_hook, {"lr": 1e-3}
    draws, paper = _drawers(method)

    def draw(trial: optuna.Trial) -> tuple[dict[str, Any], dict[str, float]]:
        model = {name: fn(trial) for name, fn in draws.items()}
        return model, {"lr": trial.suggest_float("lr", 1e-4, 3e-2, log=True)}

    return draw, {"lr": 1e-3, **paper}
