"""torchdiffeq's ``dopri5`` adjoint with the semi-norm, for one model outside a pack, with less
work: :func:`dopri5_adjoint_eager`.

The reference code trains NODE and ANODE through ``torchdiffeq.odeint_adjoint(func, x0, t,
adjoint_options={"norm": "seminorm"})`` (Chen et al., 2018, Appendix B; Kidger, Chen & Lyons,
2021), and the paper's adaptive-solver tables run it with ``dopri5`` (Dormand & Prince, 1980).
Its backward (torchdiffeq ``_impl/adjoint.py``) solves, for each output interval, last first,
the augmented system ``[t, x, a, g]`` backwards in time with a fresh ``odeint`` call: the
time's adjoint, the state, the state's adjoint and the parameters' adjoint, concatenated into
one flat vector (``_TupleFunc``) and split again at every evaluation. With the semi-norm the
error control reads only ``[t, x, a]``; the parameters' adjoint ``g`` (all the weights,
thousands of numbers) is carried through every Runge–Kutta stage, error estimate and dense
output fit anyway, and every evaluation passes through four wrappers (tuple, reversal,
perturbation, the augmented dynamics).

The twin computes the same numbers by the same operations, element for element, and skips
what no output depends on:

* the control part ``[t, x, a]`` and ``g`` are two vectors; every operation torchdiffeq applies
  to the flat vector is applied to each part (all are element-wise, or reductions within one
  element's row of stages, so each element's bytes are the same);
* ``g`` never enters the vector field, so its stage values, error estimate and dense output
  fit are not formed: only its value at each accepted step's end (the last stage, by the
  Dormand–Prince "first same as last" property), and the dense output at the interval's end
  from the last accepted step;
* the dense output is fitted once per interval, for the step the output lies in (torchdiffeq
  fits every accepted step and evaluates only the last fit);
* the initial step's second evaluation (Hairer, Nørsett & Wanner, 1993, §II.4) only sizes the
  step, so its vector–Jacobian product skips the parameters.

The forward solve is torchdiffeq's ``odeint`` itself, as in ``odeint_adjoint``. What the
augmented dynamics compute, they compute as torchdiffeq's do, quirk included: the time handed
to the field requires a gradient (``t_.requires_grad_(True)`` makes it so whatever
``t_requires_grad`` says), so the time's adjoint ``t`` is integrated and enters the
semi-norm. The tests compare the twin with ``odeint_adjoint`` bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchdiffeq import odeint

from nlmodels.baselines._dopri import ORDER, interp_evaluate, interp_fit, tableau
from nlmodels.baselines._euler import Field

__all__ = ["dopri5_adjoint_eager"]


def dopri5_adjoint_eager(
    field: Field,
    x0: torch.Tensor,
    times: torch.Tensor,
    owner: nn.Module | None,
    *,
    rtol: float,
    atol: float,
) -> torch.Tensor:
    """``[T, B, S]``: bit for bit what ``odeint_adjoint(field, x0, times, rtol=rtol, atol=atol,
    method="dopri5", adjoint_params=owner.parameters(), adjoint_options={"norm":
    "seminorm"})`` computes, forwards and backwards, with less work (the module's docstring).
    Without gradients to compute, torchdiffeq's plain ``odeint`` (the same forward)."""
    if times.requires_grad:
        raise ValueError("the dopri5 adjoint twin does not differentiate the time grid")
    # as torchdiffeq does: frozen parameters are left out of the adjoint
    params = () if owner is None else tuple(p for p in owner.parameters() if p.requires_grad)
    if not (torch.is_grad_enabled() and (x0.requires_grad or params)):
        return odeint(field, x0, times, rtol=rtol, atol=atol, method="dopri5")
    return _EagerDopri5Adjoint.apply(field, rtol, atol, x0, times, *params)


class _EagerDopri5Adjoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, field: Field, rtol: float, atol: float, x0, times, *params) -> torch.Tensor:
        with torch.no_grad():
            sol = odeint(field, x0, times, rtol=rtol, atol=atol, method="dopri5")
        ctx.field, ctx.rtol, ctx.atol = field, rtol, atol
        ctx.save_for_backward(times, sol, *params)
        return sol

    @staticmethod
    def backward(ctx, grad_sol: torch.Tensor):
        times, sol, *params = ctx.saved_tensors
        with torch.no_grad():
            solver = _AdjointSolver(ctx.field, tuple(params), sol, ctx.rtol, ctx.atol)
            adj_t = torch.zeros((), dtype=sol.dtype, device=sol.device)
            adj = grad_sol[-1]
            adj_params = _flat([torch.zeros_like(p) for p in params], sol)
            for i in range(times.shape[0] - 1, 0, -1):
                adj_t, adj, adj_params = solver.interval(
                    times[i], times[i - 1], adj_t, sol[i], adj, adj_params
                )
                adj = adj + grad_sol[i - 1]
        grads, start = [], 0
        for p in params:
            grads.append(adj_params[start : start + p.numel()].view_as(p))
            start += p.numel()
        return None, None, None, adj, None, *grads


class _AdjointSolver:
    """One backward interval of torchdiffeq's adjoint: its ``odeint`` from ``t_i`` to
    ``t_{i−1}`` on ``[t, x, a | g]``, the dopri5 solver of ``_impl/rk_common.py`` step by step."""

    def __init__(
        self,
        field: Field,
        params: Sequence[torch.Tensor],
        sol: torch.Tensor,
        rtol: float,
        atol: float,
    ) -> None:
        self.field, self.params = field, tuple(params)
        self.dtype, device = sol.dtype, sol.device
        self.shape = sol.shape[1:]
        self.size = sol[0].numel()
        #: the solver's time dtype (``RKAdaptiveStepsizeODESolver``: float64 or wider)
        self.t_dtype = torch.promote_types(torch.float64, sol.abs().dtype)

        def scalar(v: float) -> torch.Tensor:
            return torch.as_tensor(v, dtype=self.t_dtype, device=device)

        self.rtol, self.atol = scalar(rtol), scalar(atol)
        self.min_step, self.max_step = scalar(0), scalar(float("inf"))
        self.tab = tableau(self.dtype, device)  # (its step control's factors in float64)

    # -- the augmented dynamics, reversed in time ---------------------------------------------

    def _eval(
        self, t: torch.Tensor, control: torch.Tensor, perturb_prev: bool, with_params: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``−1 · [vjp_t, f, vjp_x | vjp_g]`` at solver time ``t`` (the reversed time): what
        ``_PerturbFunc(_ReverseFunc(_TupleFunc(augmented_dynamics), mul=−1))`` returns."""
        t = t.to(control.abs().dtype)
        if perturb_prev:
            t = torch.nextafter(t, t - 1)
        x, a = self._split(control)
        with torch.enable_grad():
            tq = (-t).detach().requires_grad_(True)
            xq = x.detach().requires_grad_(True)
            f = self.field(tq, xq)
            wrt = (tq, xq, *self.params) if with_params else (tq, xq)
            grads = torch.autograd.grad(f, wrt, -a, allow_unused=True)
        vjp_t, vjp_x = (torch.zeros_like(v) if g is None else g for v, g in zip((tq, xq), grads))
        out = -1.0 * torch.cat([vjp_t.reshape(-1), f.reshape(-1), vjp_x.reshape(-1)])
        if not with_params:
            return out, None
        vjp_g = [torch.zeros_like(p) if g is None else g for p, g in zip(self.params, grads[2:])]
        return out, -1.0 * _flat(vjp_g, out)

    def _split(self, control: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.size
        return control[1 : 1 + n].view(self.shape), control[1 + n :].view(self.shape)

    def _norm(self, control: torch.Tensor) -> torch.Tensor:
        """The semi-norm: ``max(|t|, rms(x), rms(a))`` (``handle_adjoint_norm_``)."""
        x, a = self._split(control)
        return max(control[0].abs(), _rms(x), _rms(a))

    # -- one interval ------------------------------------------------------------------------

    def interval(
        self,
        t_from: torch.Tensor,
        t_to: torch.Tensor,
        adj_t: torch.Tensor,
        x: torch.Tensor,
        adj: torch.Tensor,
        adj_params: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Solve from ``t_from`` back to ``t_to``; ``(t, a, g)`` there (x is the forward's)."""
        y0 = torch.cat([adj_t.reshape(-1), x.reshape(-1), adj.reshape(-1)])
        g0 = adj_params
        # the reversed times (``_check_inputs``: t = −t), in the solver's dtype (``integrate``)
        start = (-t_from).to(self.t_dtype)
        end = (-t_to).to(self.t_dtype)
        f0, fg0 = self._eval(start, y0, False)
        dt = self._initial_step(start, y0, f0)
        t1 = start
        last = None  # the last accepted step: (its start, y0, y1, k, g0, g1, kg, dt)
        while end > t1:
            step_start = t1
            if not torch.isfinite(dt):
                dt = self.min_step
            dt = dt.clamp(self.min_step, self.max_step)
            t_end = step_start + dt
            assert step_start + dt > step_start, f"underflow in dt {dt.item()}"
            assert torch.isfinite(y0).all() and torch.isfinite(g0).all(), "non-finite state"
            y1, f1, err, k, kg = self._step(y0, f0, fg0, step_start, dt, t_end)
            ratio = _error_ratio(err, self.rtol, self.atol, y0, y1, self._norm)
            # the error test, overruled outside the step bounds (as torchdiffeq's, in its order)
            within = not bool(dt > self.max_step)
            accept = (bool(ratio <= 1) and within) or bool(dt <= self.min_step)
            if accept:
                g1 = g0 + torch.sum(kg[..., :6] * (self.tab.beta[5] * dt.to(self.dtype)), dim=-1)
                last = (step_start, y0, y1, k, g0, g1, kg, dt)
                t1 = t_end
                y0, f0, g0, fg0 = y1, f1, g1, kg[..., -1]
            dt = _optimal_step_size(dt, ratio, self.tab.safety, self.tab.ifactor, self.tab.dfactor)
            dt = dt.clamp(self.min_step, self.max_step)
        assert last is not None
        t0, ys, ye, k, gs, ge, kg, step = last  # (the loop ends on an accepted step, at t1)
        y_out = _evaluate(self._fit(ys, ye, k, step), t0, t1, end)
        g_out = _evaluate(self._fit(gs, ge, kg, step), t0, t1, end)
        _, a_out = self._split(y_out)
        return y_out[0], a_out, g_out

    def _initial_step(self, t0: torch.Tensor, y0: torch.Tensor, f0: torch.Tensor) -> torch.Tensor:
        """``_select_initial_step`` with the semi-norm (order 4: dopri5's order − 1)."""
        scale = self.atol + torch.abs(y0) * self.rtol
        d0 = self._norm(y0 / scale).abs()
        d1 = self._norm(f0 / scale).abs()
        if d0 < 1e-5 or d1 < 1e-5:
            h0 = torch.tensor(1e-6, dtype=y0.dtype, device=y0.device)
        else:
            h0 = 0.01 * d0 / d1
        h0 = h0.abs()
        f1, _ = self._eval(t0 + h0, y0 + h0 * f0, False, with_params=False)
        d2 = torch.abs(self._norm((f1 - f0) / scale) / h0)
        if d1 <= 1e-15 and d2 <= 1e-15:
            h1 = torch.max(torch.tensor(1e-6, dtype=y0.dtype, device=y0.device), h0 * 1e-3)
        else:
            h1 = (0.01 / max(d1, d2)) ** (1.0 / float(ORDER))
        h1 = h1.abs()
        return torch.min(100 * h0, h1).to(self.t_dtype)

    def _step(self, y0, f0, fg0, t0, dt, t1):
        """``_runge_kutta_step``: the control part's stages and error, and every stage's
        ``g`` derivative (the evaluations make them; ``g``'s own stage values are not formed)."""
        t_dtype = y0.abs().dtype
        t0, dt, t1 = t0.to(t_dtype), dt.to(t_dtype), t1.to(t_dtype)
        tab = self.tab
        k = y0.new_empty(*y0.shape, 7)
        kg = fg0.new_empty(*fg0.shape, 7)
        k[..., 0], kg[..., 0] = f0, fg0
        yi = y0
        for i, (alpha_i, beta_i) in enumerate(zip(tab.alpha, tab.beta)):
            at_end = bool(alpha_i == 1.0)
            ti = t1 if at_end else t0 + alpha_i * dt
            yi = y0 + torch.sum(k[..., : i + 1] * (beta_i * dt), dim=-1).view_as(f0)
            f, fg = self._eval(ti, yi, at_end)
            k[..., i + 1], kg[..., i + 1] = f, fg
        err = torch.sum(k * (dt * tab.c_error), dim=-1)
        return yi, k[..., -1], err, k, kg

    def _fit(self, y0, y1, k, dt) -> list[torch.Tensor]:
        """``RKAdaptiveStepsizeODESolver._interp_fit``: dense output of one step."""
        dt = dt.type_as(y0)
        return [c[0] for c in interp_fit(y0[None], y1[None], k[None], dt.reshape(1), self.tab.mid)]


def _flat(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """``tensors`` flattened into one vector, as ``_TupleFunc`` concatenates them (empty: a
    field without parameters)."""
    if not tensors:
        return like.new_zeros(0)
    return torch.cat([t.reshape(-1) for t in tensors])


def _rms(x: torch.Tensor) -> torch.Tensor:
    """torchdiffeq's ``_rms_norm``."""
    return x.abs().pow(2).mean().sqrt()


def _error_ratio(err, rtol, atol, y0, y1, norm) -> torch.Tensor:
    """torchdiffeq's ``_compute_error_ratio``."""
    error_tol = atol + rtol * torch.max(y0.abs(), y1.abs())
    return norm(err / error_tol).abs()


def _optimal_step_size(last_step, error_ratio, safety, ifactor, dfactor) -> torch.Tensor:
    """torchdiffeq's ``_optimal_step_size`` for a 5th-order method."""
    if error_ratio == 0:
        return last_step * ifactor
    if error_ratio < 1:
        dfactor = torch.ones((), dtype=last_step.dtype, device=last_step.device)
    error_ratio = error_ratio.type_as(last_step)
    exponent = torch.tensor(ORDER, dtype=last_step.dtype, device=last_step.device).reciprocal()
    return last_step * torch.min(ifactor, torch.max(safety / error_ratio**exponent, dfactor))


def _evaluate(coefficients, t0, t1, t) -> torch.Tensor:
    """torchdiffeq's ``_interp_evaluate`` at time ``t`` of the step from ``t0`` to ``t1``."""
    return interp_evaluate(coefficients, ((t - t0) / (t1 - t0)).to(coefficients[0].dtype))
