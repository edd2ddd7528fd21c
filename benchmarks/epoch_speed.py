"""Seconds per training epoch: our Neural Laplace against the reference ``torchlaplace`` package.

Paper configuration (GRU 2 × 21, K = 2, g hidden 64, 33 terms, Fourier ILT), float64, one thread,
800 trajectories of 2 dims, 100 observed + 100 predicted points, batch 128, Adam (lr 1e-3) with
gradient-norm clipping at 1. The models train in the SAME process, epochs interleaved, on the same
data: ours (with the native CPU kernels of ``nlmodels.accel.native`` when they build), ours on its
pure-torch path (``NLLAB_NATIVE=0``, from the same weights) and the reference. The script prints
the median and minimum epoch time of each and the ratios, and checks that our model and the
reference compute the same function (our weights copied from the reference's, outputs compared).

The reference must be importable: run this script with the interpreter of a separate benchmark
environment that has it (never a runtime dependency of the platform):

    python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0 torchlaplace==0.0.4
    PYTHONPATH=. .venv-bench/bin/python benchmarks/epoch_speed.py

Without the reference it times our model alone.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nlmodels import NeuralLaplace
from nlmodels.accel.native import native_enabled
from nlmodels.diagnostics import trajectories


def reference_model():
    try:
        from experiments.baseline_models.neural_laplace import NeuralLaplace as RefNL
    except ImportError:
        return None
    # exp_all_baselines.py: hidden_units=42 (-> GRU 21), g keeps its default width 64.
    return RefNL(
        2,
        2,
        latent_dim=2,
        hidden_units=42,
        s_recon_terms=33,
        use_sphere_projection=True,
        encode_obs_time=False,
        ilt_algorithm="fourier",
    )


def copy_reference_weights(ours: NeuralLaplace, ref: torch.nn.Module) -> None:
    ref_state = ref.state_dict()
    mapping = {
        "laplace.first": "laplace_rep_func.linear_tanh_stack.0",
        "laplace.hidden": "laplace_rep_func.linear_tanh_stack.2",
        "laplace.out": "laplace_rep_func.linear_tanh_stack.4",
    }
    new_state = {}
    for key in ours.state_dict():
        src = key
        for a, b in mapping.items():
            if key.startswith(a):
                src = key.replace(a, b)
        new_state[key] = ref_state[src].clone()
    ours.load_state_dict(new_state)


class Trainer:
    def __init__(self, model, forward, t, x, batch: int, seed: int, clock, native="auto") -> None:
        self.clock, self.native = clock, native
        self.model, self.forward = model, forward
        self.t, self.x, self.batch = t, x, batch
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        self.gen = torch.Generator().manual_seed(seed)
        self.loss = float("nan")

    def epoch(self) -> float:
        os.environ["NLLAB_NATIVE"] = self.native  # read at every call: switches our CPU path
        start = self.clock()
        order = torch.randperm(self.x.shape[0], generator=self.gen)
        obs_t, query_t = self.t[:100], self.t[100:]
        for i in range(0, len(order), self.batch):
            xb = self.x[order[i : i + self.batch]]
            self.opt.zero_grad()
            pred = self.forward(obs_t, xb[:, :100], query_t)
            loss = torch.nn.functional.mse_loss(pred, xb[:, 100:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.loss = loss.item()
        return self.clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=6, help="timed epochs per model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trajectories", type=int, default=800)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument(
        "--no-torch-path",
        action="store_true",
        help="skip timing our model on its pure-torch path (NLLAB_NATIVE=0)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or this thread's CPU time (steadier on a shared machine)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t, x = trajectories(args.trajectories, seed=0)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time

    torch.manual_seed(0)
    ours = NeuralLaplace(2).double()
    ref = reference_model()
    if ref is not None:
        ref = ref.double()
        copy_reference_weights(ours, ref)
    trainers = {"ours": Trainer(ours, ours, t, x, args.batch, 1, clock)}
    if not args.no_torch_path:  # the same model without the native kernels, from the same weights
        torch_path = copy.deepcopy(ours)
        trainers["ours-torch"] = Trainer(torch_path, torch_path, t, x, args.batch, 1, clock, "0")
    if ref is not None:
        with torch.no_grad():
            a = ours(t[:100], x[:64, :100], t[100:])
            b = ref(x[:64, :100], t[:100], t[100:])
        print(
            f"same weights, max |ours - reference| prediction difference: "
            f"{(a - b).abs().max().item():.2e} (max |prediction| {b.abs().max().item():.2f})"
        )
        trainers["reference"] = Trainer(
            ref, lambda ot, ox, qt: ref(ox, ot, qt), t, x, args.batch, 1, clock
        )
    else:
        print("reference torchlaplace not importable: timing our model only")

    times: dict[str, list[float]] = {k: [] for k in trainers}
    for tr in trainers.values():  # warm-up epoch, not timed
        tr.epoch()
    for _ in range(args.epochs):
        for name, tr in trainers.items():
            times[name].append(tr.epoch())

    os.environ["NLLAB_NATIVE"] = "auto"
    print(f"native CPU kernels for 'ours': {'on' if native_enabled() else 'unavailable'}")
    print(
        f"\nepoch of {args.trajectories} trajectories x 2 dims, 100 obs + 100 pred points, "
        f"batch {args.batch}, float64, {args.threads} thread(s), {args.clock} clock, "
        f"median of {args.epochs}:"
    )
    for name, ts in times.items():
        print(
            f"  {name:11s} {statistics.median(ts):7.3f} s/epoch   "
            f"(min {min(ts):.3f}, last train loss {trainers[name].loss:.4f})"
        )
    if "reference" in times:
        for name in (n for n in times if n != "reference"):
            ratio = statistics.median(times["reference"]) / statistics.median(times[name])
            best = min(times["reference"]) / min(times[name])
            print(f"  speed-up {name} vs reference: {ratio:.2f}x (median), {best:.2f}x (min)")


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
