"""The one multilayer-perceptron builder every baseline uses."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from torch import nn

__all__ = ["mlp"]


def mlp(
    in_dim: int,
    hidden: Sequence[int],
    out_dim: int,
    *,
    activation: type[nn.Module] = nn.Tanh,
    wrap: Callable[[nn.Linear], nn.Module] | None = None,
) -> nn.Sequential:
    """``Linear → act → … → Linear`` with the given hidden widths (no activation on the output).

    ``wrap`` is applied to every linear layer (the ResNet flow passes spectral normalisation).
    """
    widths = [int(in_dim), *(int(h) for h in hidden), int(out_dim)]
    if min(widths) < 1:
        raise ValueError(f"layer widths must be >= 1, got {widths}")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        lin = nn.Linear(a, b)
        layers.append(wrap(lin) if wrap is not None else lin)
        if i < len(widths) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)
