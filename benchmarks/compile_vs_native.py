"""Native C kernels against ``torch.compile`` of the model's plain formulas (CPU, float64).

Paper configuration (GRU 2 × 21, K = 2, g hidden 64, 33 terms, Fourier ILT), float64, one thread,
trajectories of 2 dims, 100 observed + 100 predicted points, batch 128, Adam with clipping (the
training loop of ``benchmarks/epoch_speed.py``). From the same weights, in one process, epochs
interleaved:

* ``native``: the eager model on the native kernels (``NLLAB_NATIVE=1``);
* ``torch``: the eager model on the kernels' torch twins (``NLLAB_NATIVE=0``);
* ``compiled``: ``torch.compile(model)``; under the compiler the model runs its plain formulas
  (``nn.GRU``, g, then the ILT sum; see ``nlmodels.accel.select``), which inductor fuses.

Then the two parts the kernels accelerate, forward + backward on one batch: the encoder GRU and
the decoder (g and the ILT sum, from p). Each figure is the median over rounds, of this thread's
CPU time by default (steadier on a shared machine). The compile time is reported separately.

    PYTHONPATH=. .venv/bin/python benchmarks/compile_vs_native.py --epochs 5
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from epoch_speed import Trainer

from nlmodels import NeuralLaplace, native_cpu_kernels
from nlmodels.accel import gru_final_output
from nlmodels.diagnostics import trajectories


def _median_ratio(times: dict[str, list[float]], slow: str, fast: str) -> float:
    return statistics.median(times[slow]) / statistics.median(times[fast])


def _time_part(fn, clock, repeats: int) -> float:
    """Median time of ``fn()`` (forward + backward of one part) over ``repeats`` calls."""
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        samples.append(clock() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs per variant")
    parser.add_argument("--trajectories", type=int, default=800)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--part-repeats", type=int, default=5, help="timed calls per part/round")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    os.environ["NLLAB_NATIVE"] = "1"
    if not native_cpu_kernels():
        raise SystemExit("the native kernels do not build here: nothing to compare")
    t, x = trajectories(args.trajectories, seed=0)
    obs_t, query_t = t[:100], t[100:]

    torch.manual_seed(0)
    base = NeuralLaplace(2).double()
    models = {name: copy.deepcopy(base) for name in ("native", "torch", "compiled")}
    compiled = torch.compile(models["compiled"])
    trainers = {
        "native": Trainer(models["native"], models["native"], t, x, args.batch, 1, clock, "1"),
        "torch": Trainer(models["torch"], models["torch"], t, x, args.batch, 1, clock, "0"),
        "compiled": Trainer(models["compiled"], compiled, t, x, args.batch, 1, clock, "1"),
    }
    # same weights, same function: the first batch's predictions agree
    with torch.no_grad():
        xb = x[: args.batch]
        os.environ["NLLAB_NATIVE"] = "1"
        ref = models["native"](obs_t, xb[:, :100], query_t)
        diff = (compiled(obs_t, xb[:, :100], query_t) - ref).abs().max().item()
    print(f"compiled vs native prediction, same weights: max |diff| {diff:.1e}")
    start = time.perf_counter()
    trainers["compiled"].epoch()  # compiles the training graphs (forward and backward)
    print(f"torch.compile: first epoch (compilation included) {time.perf_counter() - start:.1f} s")
    for name in ("native", "torch"):
        trainers[name].epoch()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(args.epochs):
        for name, trainer in trainers.items():
            times[name].append(trainer.epoch())

    # the two accelerated parts, forward + backward on one batch, from the same weights
    gru = models["native"].encoder.gru
    enc_x = torch.flip(x[: args.batch, :100], dims=(1,)).requires_grad_(True)
    gru_compiled = torch.compile(lambda inputs: gru_final_output(inputs, gru))
    p = torch.randn(args.batch, 2, dtype=torch.float64, requires_grad=True)
    decoder = models["native"]
    decode_compiled = torch.compile(decoder.decode)

    def encoder_step(fn):
        return lambda: fn(enc_x).sum().backward()

    def decoder_step(fn):
        return lambda: fn(p, query_t).square().sum().backward()

    parts = {
        ("encoder", "native", "1"): encoder_step(lambda v: gru_final_output(v, gru)),
        ("encoder", "torch", "0"): encoder_step(lambda v: gru_final_output(v, gru)),
        ("encoder", "compiled", "1"): encoder_step(gru_compiled),
        ("decoder", "native", "1"): decoder_step(decoder.decode),
        ("decoder", "torch", "0"): decoder_step(decoder.decode),
        ("decoder", "compiled", "1"): decoder_step(decode_compiled),
    }
    part_times: dict[tuple[str, str], list[float]] = {key[:2]: [] for key in parts}
    for (_, _, mode), fn in parts.items():  # warm-up (compiles)
        os.environ["NLLAB_NATIVE"] = mode
        fn()
    for _ in range(args.epochs):
        for (part, variant, mode), fn in parts.items():
            os.environ["NLLAB_NATIVE"] = mode
            part_times[(part, variant)].append(_time_part(fn, clock, args.part_repeats))
    os.environ["NLLAB_NATIVE"] = "auto"

    print(
        f"\nepoch of {args.trajectories} trajectories, batch {args.batch}, float64, 1 thread, "
        f"{args.clock} clock, median of {args.epochs} interleaved rounds:"
    )
    for name, ts in times.items():
        print(f"  {name:9s} {statistics.median(ts):7.3f} s/epoch (min {min(ts):.3f})")
    print(f"  native is {_median_ratio(times, 'compiled', 'native'):.2f}x faster than compiled, "
          f"{_median_ratio(times, 'torch', 'native'):.2f}x faster than its torch twin")  # fmt: skip
    print(f"\nparts, forward + backward of one batch of {args.batch} (ms):")
    for part in ("encoder", "decoder"):
        ms = {v: 1e3 * statistics.median(part_times[(part, v)]) for v in trainers}
        print(
            f"  {part}: native {ms['native']:.2f}, torch {ms['torch']:.2f}, compiled "
            f"{ms['compiled']:.2f}; native {ms['compiled'] / ms['native']:.2f}x faster than "
            "compiled"
        )


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
