"""Euler on the output grid (:func:`euler_steps`), and torchdiffeq's adjoint of it written so
that a pack of models can run it under ``torch.func.vmap`` (:func:`euler_adjoint`): each member
its own forward solve, its own backward adjoint solve.

The reference code trains NODE and ANODE through ``torchdiffeq.odeint_adjoint(func, x0, t,
method="euler", adjoint_options={"norm": "seminorm"})`` (Chen et al., 2018, §2 and Appendix B;
torchdiffeq ``_impl/adjoint.py``). That function is an ``autograd.Function`` with host reads and
no batching rule, so it cannot run inside ``vmap`` (a pack) nor be captured into a CUDA graph.
:func:`euler_adjoint` computes the same numbers with tensors only:

* forward: Euler steps on the output grid, ``x_k = x_{k-1} + (t_k - t_{k-1}) f(t_{k-1},
  x_{k-1})``, torchdiffeq's ``euler`` (``FixedGridODESolver``: the output points are its step
  ends);
* backward: for each interval, last first, one Euler step of the augmented system backwards
  in time from ``t_i`` (torchdiffeq negates the time and the field, ``_ReverseFunc``), with the
  state taken from the forward solve at ``t_i``: the adjoint ``a`` and the parameters' adjoint
  ``g`` step by ``a ← a + h·(−1·vjp_y)``, ``g ← g + h·(−1·vjp_θ)``, where ``vjp`` is the
  vector–Jacobian product of ``f(t_i, x_i)`` with ``−a`` and ``h = t_i − t_{i−1}``; then the
  loss's gradient at ``t_{i−1}`` is added to ``a``. A fixed-step solve has no error control, so
  the semi-norm (Kidger, Chen & Lyons, 2021) changes nothing here; the time gradient is not
  computed (the times do not require one in training).

It is the continuous adjoint's Euler estimate, not the gradient of the discrete Euler solve
(``docs/results/fidelity.md``, "NODE/ANODE gradients"); on ``dx/dt = a·x`` with a loss ``x(T)``
it is ``T·x0·(1 + a·h)^N`` where back-propagation through the solve gives ``T·x0·(1 + a·h)^(N−1)``.

The backward is an ``autograd.Function`` with ``generate_vmap_rule``: under ``vmap`` each
member's vector–Jacobian products are its own (``torch.func.vjp``), so a member's gradient is
what its pack of one computes. Its arithmetic is torchdiffeq's, operation for operation; the
tests compare the two on the CPU.

One model outside a pack takes :func:`euler_adjoint_eager`: the same numbers by the same
operations, with less work. torchdiffeq's backward calls ``odeint`` once per interval on a
flattened augmented state (``[t, x, a, g]``, concatenated and split again at every step, the
state ``x`` stepped backwards only to be replaced by the forward's), and evaluates ``f(t_i,
x_i)`` again to differentiate it; the eager twin keeps the graph of each forward evaluation
``f(t_k, x_k)``, which for ``k ≥ 1`` is exactly the evaluation the backward needs at ``t_i =
t_k`` (the same inputs: the forward's state, the grid's time), and differentiates it with
``torch.autograd.grad``, as torchdiffeq's augmented dynamics do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, vjp

__all__ = ["Field", "euler_adjoint", "euler_adjoint_eager", "euler_steps"]

#: ``field(t, x)``: ``t`` a 0-d time (or ``[B]``), ``x [B, S]`` → ``dx/dt [B, S]``.
Field = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def euler_steps(field: Field, x0: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """Euler steps on the output grid: the arithmetic of torchdiffeq's ``euler`` (whose output
    grid points are its own step ends), without its in-place writes into an unbatched solution
    buffer, so the solve also runs under ``torch.func.vmap`` and on tensors only (no host reads).
    """
    xs = [x0]
    for k in range(times.shape[0] - 1):
        t0, t1 = times[k], times[k + 1]
        xs.append(xs[-1] + (t1 - t0) * field(t0, xs[-1]))
    return torch.stack(xs)


class _Bound(nn.Module):
    """``field(t, x)`` as the forward of a module that holds the field's module, so that
    ``functional_call`` can evaluate it with other tensors in place of the parameters."""

    def __init__(self, owner: nn.Module, field: Field) -> None:
        super().__init__()
        self.owner = owner
        self.field = field

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.field(t, x)


class _EulerAdjoint(torch.autograd.Function):
    """Euler forward, torchdiffeq's Euler adjoint backward (see the module's docstring)."""

    generate_vmap_rule = True  # forward and backward are plain torch ops and torch.func.vjp

    @staticmethod
    def forward(
        bound: _Bound, names: tuple[str, ...], x0: torch.Tensor, times: torch.Tensor, *params
    ) -> torch.Tensor:
        state = dict(zip(names, params, strict=True))
        return euler_steps(lambda t, x: functional_call(bound, state, (t, x)), x0, times)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        bound, names, _, times, *params = inputs
        ctx.bound, ctx.names = bound, names
        ctx.save_for_backward(times, output, *params)

    @staticmethod
    def backward(ctx, grad_sol: torch.Tensor):
        times, sol, *params = ctx.saved_tensors
        bound, names = ctx.bound, ctx.names
        adj = grad_sol[-1]
        adj_params = [torch.zeros_like(p) for p in params]
        for i in range(times.shape[0] - 1, 0, -1):
            t_i = times[i]

            def f(x: torch.Tensor, *p: torch.Tensor, t_i: torch.Tensor = t_i) -> torch.Tensor:
                return functional_call(bound, dict(zip(names, p, strict=True)), (t_i, x))

            pullback = vjp(f, sol[i], *params)[1]
            vjp_x, *vjp_params = pullback(-adj)
            adj, adj_params = _adjoint_step(times, i, adj, adj_params, vjp_x, vjp_params, grad_sol)
        return None, None, adj, None, *adj_params


def _adjoint_step(
    times: torch.Tensor,
    i: int,
    adj: torch.Tensor,
    adj_params: Sequence[torch.Tensor],
    vjp_x: torch.Tensor,
    vjp_params: Sequence[torch.Tensor],
    grad_sol: torch.Tensor,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """torchdiffeq's Euler step of the augmented system from ``t_i`` back to ``t_{i−1}``, given
    the vector–Jacobian products of ``f(t_i, x_i)`` with ``−a``; then the loss's gradient at
    ``t_{i−1}`` added to the adjoint."""
    # its step on the reversed grid: dt = (−t_{i−1}) − (−t_i), exactly t_i − t_{i−1};
    # the field ×(−1)
    h = times[i] - times[i - 1]
    adj = adj + h * (-1.0 * vjp_x)
    adj_params = [a + h * (-1.0 * v) for a, v in zip(adj_params, vjp_params, strict=True)]
    return adj + grad_sol[i - 1], adj_params


def euler_adjoint(
    field: Field, x0: torch.Tensor, times: torch.Tensor, owner: nn.Module
) -> torch.Tensor:
    """``[T, B, S]``: Euler's solution of ``dx/dt = field(t, x)`` from ``x0 [B, S]`` at
    ``times[0]``, at every point of ``times [T]``, differentiated (with respect to ``x0`` and
    ``owner``'s parameters, which ``field`` reads) by torchdiffeq's Euler adjoint: what
    ``odeint_adjoint(field, x0, times, method="euler", adjoint_params=owner.parameters(),
    adjoint_options={"norm": "seminorm"})`` computes, inside ``vmap`` too."""
    named: Sequence[tuple[str, torch.Tensor]] = list(owner.named_parameters())
    names = tuple(f"owner.{n}" for n, _ in named)
    bound = _Bound(owner, field)
    return _EulerAdjoint.apply(bound, names, x0, times, *(p for _, p in named))


class _EagerEulerAdjoint(torch.autograd.Function):
    """Euler forward keeping each step's graph, torchdiffeq's Euler adjoint backward through
    those graphs (see the module's docstring); one model, not under ``vmap``."""

    @staticmethod
    def forward(
        ctx, field: Field, count: Callable[[], None] | None, x0: torch.Tensor, times, *params
    ) -> torch.Tensor:
        xs = [x0.detach()]
        graphs: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        with torch.enable_grad():
            for k in range(times.shape[0] - 1):
                x = xs[-1].requires_grad_(True)  # (a tensor of this solve's own, no history)
                f = field(times[k], x)
                graphs.append((x, f))
                xs.append(x.detach() + (times[k + 1] - times[k]) * f.detach())
        ctx.field, ctx.count, ctx.graphs = field, count, graphs
        sol = torch.stack([x.detach() for x in xs])
        ctx.save_for_backward(times, sol, *params)
        return sol

    @staticmethod
    def backward(ctx, grad_sol: torch.Tensor):
        times, sol, *params = ctx.saved_tensors
        graphs, ctx.graphs = ctx.graphs, None
        last = times.shape[0] - 1
        adj = grad_sol[-1]
        adj_params = [torch.zeros_like(p) for p in params]
        for i in range(last, 0, -1):
            # the one point the forward did not evaluate the field at; every point on a second
            # backward through the same solve (``retain_graph``), the first having used them
            if i == last or graphs is None:
                with torch.enable_grad():
                    x = sol[i].detach().requires_grad_(True)
                    f = ctx.field(times[i], x)
            else:
                x, f = graphs[i]
                graphs[i] = None  # (freed as the backward passes it)
                if ctx.count is not None:
                    ctx.count()
            vjp_x, *vjp_params = torch.autograd.grad(f, (x, *params), -adj, allow_unused=True)
            vjp_x = torch.zeros_like(x) if vjp_x is None else vjp_x
            vjp_params = [
                torch.zeros_like(p) if v is None else v for p, v in zip(params, vjp_params)
            ]
            adj, adj_params = _adjoint_step(times, i, adj, adj_params, vjp_x, vjp_params, grad_sol)
        return None, None, adj, None, *adj_params


def euler_adjoint_eager(
    field: Field,
    x0: torch.Tensor,
    times: torch.Tensor,
    owner: nn.Module | None,
    *,
    count: Callable[[], None] | None = None,
) -> torch.Tensor:
    """``[T, B, S]``: what :func:`euler_adjoint` computes, bit for bit what torchdiffeq's
    ``odeint_adjoint(field, x0, times, method="euler", adjoint_params=owner.parameters(),
    adjoint_options={"norm": "seminorm"})`` computes, for one model outside ``vmap``, with
    less work (the module's docstring). ``count()`` is called for each evaluation of ``field``
    that the backward takes from the forward instead of making it again (torchdiffeq makes
    it), so that a model's count of evaluations stays torchdiffeq's. Without gradients to
    compute, the plain Euler solve (:func:`euler_steps`)."""
    if times.requires_grad:
        raise ValueError("the Euler adjoint does not differentiate the time grid")
    # as torchdiffeq does: frozen parameters are left out of the adjoint
    params = () if owner is None else tuple(p for p in owner.parameters() if p.requires_grad)
    if not (torch.is_grad_enabled() and (x0.requires_grad or params)):
        return euler_steps(field, x0, times)
    return _EagerEulerAdjoint.apply(field, count, x0, times, *params)
