"""How much memory a cell's model needs to train, estimated before any weight is allocated, and
the checks that refuse a model before anything starts: one that cannot fit, one whose constructor
refuses its settings.

The model is built on PyTorch's ``meta`` device (shapes only, no storage), so a model of 10^16
parameters costs nothing to measure. Training holds each parameter four times: the weights,
their gradients and Adam's two moment estimates (Kingma & Ba 2015).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from tasks.errors import SettingError

if TYPE_CHECKING:
    from tasks.config import CellConfig

__all__ = [
    "TRAINING_COPIES",
    "ModelRefused",
    "ModelTooLarge",
    "check_models_build",
    "check_models_fit",
    "free_bytes",
    "training_bytes",
]

#: Copies of each parameter that training holds: weights, gradients, Adam's m and v.
TRAINING_COPIES = 4


def training_bytes(method: str, state_dim: int, overrides: dict, dtype: str) -> int | None:
    """Bytes of ``method``'s parameters during training, or ``None`` when the model cannot be
    built without allocating (its constructor reads a value from a tensor).

    Raises:
        ValueError, TypeError: the constructor refuses ``overrides`` (its own message), as it
            would when the cell builds it.
    """
    import torch

    from nlmodels import build_model

    try:
        with torch.device("meta"):
            model = build_model(method, state_dim, **overrides)
    except (ValueError, TypeError):
        raise
    except Exception:  # a value read from a meta tensor: not measurable this way
        return None
    size = torch.finfo(torch.float64 if dtype == "float64" else torch.float32).bits // 8
    return sum(p.numel() for p in model.parameters()) * size * TRAINING_COPIES


def free_bytes(device: str) -> int:
    """Memory available to a model on ``device`` (``cpu``, ``cuda`` or ``auto``: the larger)."""
    import psutil

    free = psutil.virtual_memory().available
    if device != "cpu":
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.mem_get_info()[0]
            free = gpu if device == "cuda" else max(free, gpu)
    return int(free)


class ModelTooLarge(SettingError, ValueError):
    """A model whose training cannot fit in its device's free memory (a setting to change)."""


class ModelRefused(SettingError, ValueError):
    """Model settings that the model's own constructor refuses (a value out of its range, two
    options that exclude each other), found before anything starts rather than in each cell."""


def _model_sizes(cells: Iterable[CellConfig]) -> Iterator[tuple[CellConfig, int | None]]:
    """Each distinct model of ``cells`` (one cell naming it) and its training bytes, built on
    the ``meta`` device once; :class:`ModelRefused` for the first its constructor refuses."""
    from datasets import SYSTEMS

    seen: set[tuple] = set()
    for cell in cells:
        key = (cell.method, SYSTEMS[cell.system].state_dim, repr(sorted(cell.model.items())))
        if key in seen:
            continue
        seen.add(key)
        try:
            need = training_bytes(cell.method, key[1], dict(cell.model), cell.training.dtype)
        except (ValueError, TypeError) as e:
            raise ModelRefused(f"{cell.method} on {cell.system}: {e}") from None
        yield cell, need


def check_models_build(cells: Iterable) -> None:
    """Raise :class:`ModelRefused` for the first cell whose model's constructor refuses its
    settings (whatever the device's memory: a schedule is checked so when it is loaded)."""
    for _ in _model_sizes(cells):
        pass


def check_models_fit(cells: Iterable, device: str) -> None:
    """Raise :class:`ModelRefused` for the first cell whose model's constructor refuses its
    settings, :class:`ModelTooLarge` ("this model needs N GB; M GB free") for the first whose
    model cannot fit in the free memory of ``device``; each distinct model is built (on the
    ``meta`` device) once.
    :func:`flows.benchmark.run_benchmark` checks its cells so before anything starts."""
    free: int | None = None
    for cell, need in _model_sizes(cells):
        if need is None:
            continue
        free = free_bytes(device) if free is None else free
        if need > free:
            raise ModelTooLarge(
                f"{cell.method} on {cell.system}: this model needs {need / 2**30:,.1f} GB to "
                f"train; {free / 2**30:,.1f} GB free (make its layers narrower)"
            )
