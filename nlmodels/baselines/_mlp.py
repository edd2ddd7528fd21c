"""The one multilayer-perceptron builder every baseline uses."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

__all__ = ["mlp", "stacked_linear", "stacked_mlp"]

#: A layer of several models at once: ``[M, ..., in]`` → ``[M, ..., out]``.
Stacked = Callable[[torch.Tensor], torch.Tensor]


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


def stacked_linear(state: Mapping[str, torch.Tensor], prefix: str) -> Stacked:
    """M copies of an ``nn.Linear`` at once, from their stacked ``state[prefix + "weight"]``
    ``[M, out, in]`` and ``bias`` ``[M, out]``: one batched matrix product (``baddbmm``; a
    ``vmap``ped ``F.linear`` is several times slower on the CPU)."""
    w_t = state[f"{prefix}weight"].transpose(1, 2)
    bias = state[f"{prefix}bias"].unsqueeze(1)

    def apply(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(x.shape[0], -1, x.shape[-1])
        return torch.baddbmm(bias, flat, w_t).view(*x.shape[:-1], w_t.shape[-1])

    return apply


def stacked_mlp(net: nn.Sequential, state: Mapping[str, torch.Tensor], prefix: str) -> Stacked:
    """M copies of ``net`` (built by :func:`mlp`) at once, from their stacked tensors
    ``state[prefix + name]`` (see :func:`stacked_linear`)."""
    layers: list[Stacked] = []
    for name, layer in net.named_children():
        if type(layer) is nn.Linear:
            layers.append(stacked_linear(state, f"{prefix}{name}."))
        elif type(layer) in (nn.Tanh, nn.ReLU, nn.Softplus, nn.ELU):
            layers.append(layer)  # elementwise: the members' copies are the same function
        else:
            raise TypeError(f"stacked_mlp: unsupported layer {type(layer).__name__}")

    def apply(x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            x = layer(x)
        return x

    return apply
