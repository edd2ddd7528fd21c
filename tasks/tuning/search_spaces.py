"""Hyperparameter search spaces: every Optuna ``suggest_*`` call of the platform lives here.

One function per model draws the trial's parameters and maps them to ``build_model`` keyword
overrides and training overrides. Each space also states its *paper point* (the model's own
defaults, the paper's sizes) in trial-parameter form, so a study can start from it
(:func:`paper_params`) and every later trial is compared with the configuration of the paper.

Sequence-valued model arguments (``hidden=(128, 128)``) are searched as a width and a depth.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tasks.offline  # noqa: F401  (the platform's settings, before the libraries load)

if TYPE_CHECKING:  # the spaces only call the trial they are given: checking a method's
    import optuna  # space (a schedules file, the command line) does not load Optuna

__all__ = [
    "SEARCH_SPACES",
    "SearchSpace",
    "Suggestion",
    "paper_params",
    "search_space",
    "suggest",
]

Override = bool | int | float | str | tuple[int, ...]


@dataclass(frozen=True)
class Suggestion:
    """A trial's draw: ``build_model`` overrides and ``TrainConfig`` overrides."""

    model: dict[str, Override] = field(default_factory=dict)
    training: dict[str, float | int] = field(default_factory=dict)

    def as_json(self) -> dict[str, dict[str, Any]]:
        """JSON-able form (tuples become lists), as stored in study and trial attributes."""
        return {
            "model": {k: list(v) if isinstance(v, tuple) else v for k, v in self.model.items()},
            "training": dict(self.training),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Mapping[str, Any]]) -> Suggestion:
        model = {k: tuple(v) if isinstance(v, list) else v for k, v in data["model"].items()}
        return cls(model=model, training=dict(data.get("training", {})))


@dataclass(frozen=True)
class SearchSpace:
    """A model's search space: the draw, and the paper's point in trial-parameter form."""

    method: str
    draw: Callable[[optuna.Trial], Suggestion]
    paper: Mapping[str, Any]


SEARCH_SPACES: dict[str, SearchSpace] = {}


def _space(method: str, paper: Mapping[str, Any]):
    def register(fn: Callable[[optuna.Trial], Suggestion]) -> Callable[[optuna.Trial], Suggestion]:
        SEARCH_SPACES[method] = SearchSpace(method, fn, dict(paper))
        return fn

    return register


# -- shared pieces ------------------------------------------------------------------------------
def _lr(trial: optuna.Trial) -> dict[str, float]:
    return {"lr": trial.suggest_float("lr", 1e-4, 3e-2, log=True)}


def _layers(trial: optuna.Trial, name: str, low: int, high: int, max_depth: int) -> tuple[int, ...]:
    width = trial.suggest_int(f"{name}_width", low, high, log=True)
    depth = trial.suggest_int(f"{name}_depth", 1, max_depth)
    return (width,) * depth


# -- one function per model ---------------------------------------------------------------------
@_space(
    "neural_laplace",
    {"lr": 1e-3, "latent_dim": 2, "encoder_units": 21, "encoder_layers": 2, "laplace_units": 64},
)
def neural_laplace_space(trial: optuna.Trial) -> Suggestion:
    return Suggestion(
        model={
            "latent_dim": trial.suggest_int("latent_dim", 1, 8),
            "encoder_units": trial.suggest_int("encoder_units", 8, 64, log=True),
            "encoder_layers": trial.suggest_int("encoder_layers", 1, 3),
            "laplace_units": trial.suggest_int("laplace_units", 16, 128, log=True),
        },
        training=_lr(trial),
    )


@_space("node", {"lr": 1e-3, "hidden_width": 128, "hidden_depth": 2})
def node_space(trial: optuna.Trial) -> Suggestion:
    return Suggestion(model={"hidden": _layers(trial, "hidden", 16, 256, 3)}, training=_lr(trial))


@_space("anode", {"lr": 1e-3, "hidden_width": 128, "hidden_depth": 2, "augment_dim": 1})
def anode_space(trial: optuna.Trial) -> Suggestion:
    return Suggestion(
        model={
            "hidden": _layers(trial, "hidden", 16, 256, 3),
            "augment_dim": trial.suggest_int("augment_dim", 1, 4),
        },
        training=_lr(trial),
    )


@_space(
    "latent_ode",
    {"lr": 1e-3, "latent_dim": 2, "rec_units": 40, "ode_hidden_width": 40, "ode_hidden_depth": 3},
)
def latent_ode_space(trial: optuna.Trial) -> Suggestion:
    return Suggestion(
        model={
            "latent_dim": trial.suggest_int("latent_dim", 1, 8),
            "rec_units": trial.suggest_int("rec_units", 16, 64, log=True),
            "ode_hidden": _layers(trial, "ode_hidden", 16, 128, 3),
        },
        training=_lr(trial),
    )


def _flow_space(trial: optuna.Trial) -> Suggestion:
    return Suggestion(
        model={
            "latent_dim": trial.suggest_int("latent_dim", 1, 8),
            "encoder_units": trial.suggest_int("encoder_units", 16, 64, log=True),
            "hidden": _layers(trial, "hidden", 8, 64, 3),
            "flow_layers": trial.suggest_int("flow_layers", 1, 4),
            "time_width": trial.suggest_int("time_width", 4, 16),
        },
        training=_lr(trial),
    )


_FLOW_PAPER = {"lr": 1e-3, "latent_dim": 2, "flow_layers": 2, "time_width": 8}
_space(
    "nf_coupling",
    {**_FLOW_PAPER, "encoder_units": 40, "hidden_width": 31, "hidden_depth": 2},
)(_flow_space)
_space(
    "nf_resnet",
    {**_FLOW_PAPER, "encoder_units": 52, "hidden_width": 26, "hidden_depth": 2},
)(_flow_space)


# -- access -------------------------------------------------------------------------------------
def search_space(method: str) -> SearchSpace:
    """``method``'s space: the platform's own, else (a plugin's model) the model's
    ``search_space`` hook or one derived from its typed options
    (:mod:`tasks.tuning._default_space`)."""
    if method not in SEARCH_SPACES:
        from nlmodels.model_registry import MODELS, find_model

        find_model(method)
        if method in MODELS:
            from tasks.tuning._default_space import derived_space

            draw, paper = derived_space(method)
            return SearchSpace(method, lambda trial: Suggestion(*draw(trial)), paper)
        raise ValueError(
            f"no search space for method {method!r}; methods with one: "
            + ", ".join(sorted(SEARCH_SPACES))
        )
    return SEARCH_SPACES[method]


def suggest(trial: optuna.Trial, method: str) -> Suggestion:
    """Draw ``method``'s hyperparameters for ``trial``."""
    return search_space(method).draw(trial)


def paper_params(method: str) -> dict[str, Any]:
    """The paper's configuration of ``method`` as trial parameters (for ``enqueue_trial``)."""
    return dict(search_space(method).paper)
