"""What the portable CPU numerics cost: each main model's training epoch in both modes, one run.

The six main models at the paper's configuration (800 smooth two-dimensional trajectories, 100
observed + 100 predicted points, batch 128, float64, one thread; the training loop a cell runs,
``nltrain.epoch_seconds``, with its validation batch) are timed in one child process per CPU
numerics mode (``NLLAB_CPU_NUMERICS=native`` and ``portable``, :mod:`nlmodels.numerics`), the
modes' children alternating, each repetition in a fresh pair, so that a change in a shared
machine's load hits both. An epoch's time is process CPU time (on a loaded machine wall time
measures the neighbours), one untimed epoch first. The script prints the medians and the ratio
portable / native per model, then where Neural Laplace's epoch goes in each mode (one further,
instrumented epoch: the instruments cost time of their own, so its shares, not its total, are
the point):

* ``fused kernels``: the native kernels of its encoder and decoder (:mod:`nlmodels.accel.native`;
  in the portable mode the decoder's products run inside them, ``nl_decoder_forward/backward``);
* ``products (C)`` and ``elementary functions (C)``: time inside the portable mode's C kernels
  (``nl_matmul``, ``nl_unary``, :mod:`nlmodels.accel.portable`) called from Python;
* ``portable operators, Python``: the rest of the replaced operators' time: Python dispatch,
  argument checks, ctypes, and the scaling and accumulation around the products;
* ``everything else``: torch's own operators, autograd, the optimiser, the loop, and the
  operators registered from C++ (``dispatch.cpp``: no Python to instrument;
  ``NLLAB_PORTABLE_DISPATCH=python`` times them through their Python definitions instead).

Where the reference package is installed (``pip install '.[reference]'``: torchlaplace), its
Neural Laplace is timed too, in children of its own alternating with ours, under torch's own
kernels, the same data, batches and optimiser: the ``reference / portable`` column is how many
times faster our default-mode epoch is.

``--against DIR`` also times the portable mode of another checkout (``git worktree add DIR
REV``), interleaved with this tree's children: a change's effect measured in one run.

    PYTHONPATH=. python benchmarks/portable_speed.py [--repeats 3] [--epochs 2] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]

MAIN_MODELS = ("node", "anode", "latent_ode", "nf_coupling", "nf_resnet", "neural_laplace")
MODES = ("native", "portable")
TRAJECTORIES, BATCH = 800, 128


# -- children -----------------------------------------------------------------------------------
class _Clock:
    """Process CPU time spent in instrumented callables, by category; calls nested inside an
    instrumented call of the same clock count once, for the outer one."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._depth = 0

    def timed(self, category: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                spent = time.process_time() - start
                self.seconds[category] = self.seconds.get(category, 0.0) + spent

        return wrapper


def _instrument(clock: _Clock, inner: _Clock) -> None:
    """Time the fused kernels and the portable operators (``clock``) and, inside the latter,
    the C kernels (``inner``); in this benchmark's child process only."""
    from nlmodels.accel import native, portable

    native.call = clock.timed("fused kernels", native.call)
    if not portable.installed():
        return
    portable.uninstall()
    for name, fn in list(portable.OPERATORS.items()):
        portable.OPERATORS[name] = clock.timed("portable operators", fn)
    portable.install()
    portable._kernel = inner.timed("products (C)", portable._kernel)
    portable._unary = inner.timed("elementary functions (C)", portable._unary)


def _child(models: list[str], epochs: int, breakdown: bool) -> dict[str, Any]:
    import torch

    from datasets import SplitData
    from nlmodels.diagnostics import trajectories
    from nlmodels.model_registry import build_model
    from nltrain import TrainConfig, epoch_seconds

    torch.set_num_threads(1)
    t, x = trajectories(TRAJECTORIES)
    train = SplitData.from_trajectories(t.numpy(), x.numpy(), 100)
    val = SplitData.from_trajectories(t.numpy(), x[:BATCH].numpy(), 100)

    def run(model: torch.nn.Module, n: int) -> float:
        start = time.process_time()
        epoch_seconds(model, train, val, TrainConfig(epochs=n, batch_size=BATCH))
        return (time.process_time() - start) / n

    out: dict[str, Any] = {"epoch": {}}
    for name in models:
        torch.manual_seed(0)
        model = build_model(name, 2).double()
        run(model, 1)  # untimed: loading the kernels, first-call allocations
        out["epoch"][name] = run(model, epochs)
    if breakdown and "neural_laplace" in models:
        clock, inner = _Clock(), _Clock()
        _instrument(clock, inner)
        torch.manual_seed(0)
        model = build_model("neural_laplace", 2).double()
        run(model, 1)
        clock.seconds.clear()
        inner.seconds.clear()
        total = run(model, 1)
        parts = {k: v for k, v in clock.seconds.items() if k != "portable operators"}
        parts |= inner.seconds
        if "portable operators" in clock.seconds:
            c_time = sum(inner.seconds.values())
            parts["portable operators, Python"] = clock.seconds["portable operators"] - c_time
        parts["everything else"] = total - sum(parts.values())
        out["breakdown"] = {"total": total, **parts}
    return out


def _reference_child(epochs: int) -> dict[str, Any]:
    """The reference package's Neural Laplace (``torchlaplace``'s experiments, the paper's
    configuration; ``benchmarks/epoch_speed.py``) trained the same way: Adam, clipping at 1,
    the same batches, one validation forward per epoch; under torch's own kernels (this child
    runs the native mode: the reference's users run stock torch)."""
    import torch
    from epoch_speed import Trainer, reference_model

    from nlmodels.diagnostics import trajectories

    torch.set_num_threads(1)
    t, x = trajectories(TRAJECTORIES)
    torch.manual_seed(0)
    model = reference_model()
    if model is None:
        raise SystemExit("the reference package torchlaplace is not importable")
    model = model.double()
    clock = time.process_time
    trainer = Trainer(model, lambda ot, ox, qt: model(ox, ot, qt), t, x, BATCH, 1, clock)

    def run(n: int) -> float:
        start = time.process_time()
        for _ in range(n):
            trainer.epoch()
            with torch.no_grad():  # the validation batch, as nltrain's epoch has
                model(x[:BATCH, :100], t[:100], t[100:])
        return (time.process_time() - start) / n

    run(1)  # untimed, as our models' first epoch
    return {"epoch": {"neural_laplace": run(epochs)}}


def reference_available() -> bool:
    """Whether the reference package (``pip install '.[reference]'``) can be imported."""
    import importlib.util

    return importlib.util.find_spec("torchlaplace") is not None


# -- parent -------------------------------------------------------------------------------------
def _run_child(root: Path, mode: str, args: list[str]) -> dict[str, Any]:
    script = root / "benchmarks" / Path(__file__).name
    if not script.exists():  # an older checkout: this tree's script on that tree's code
        script = Path(__file__)
    with tempfile.TemporaryDirectory(prefix="nllab-portable-speed-") as scratch:
        env = {**os.environ, "PYTHONPATH": str(root), "NLLAB_CPU_NUMERICS": mode}
        env.setdefault("NLLAB_HOME", scratch)
        out = subprocess.run(
            [sys.executable, str(script), *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"{mode} child in {root} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


REFERENCE = "reference"


def _columns(against: Path | None, reference: bool) -> list[tuple[str, Path, str]]:
    """(label, tree, mode) of each timed column; the reference's runs under the native mode."""
    cols = [("native", _ROOT, "native"), ("portable", _ROOT, "portable")]
    if against is not None:
        cols.append(("portable, other tree", against, "portable"))
    if reference:
        cols.append((REFERENCE, _ROOT, "native"))
    return cols


def _print_breakdown(label: str, parts: dict[str, float]) -> None:
    total = parts["total"]
    print(f"\nNeural Laplace, {label} mode: one instrumented epoch, {total:.3f} s")
    for key, seconds in parts.items():
        if key != "total":
            print(f"  {key:30} {seconds:7.3f} s  {100 * seconds / total:5.1f} %")


def measure(args: argparse.Namespace) -> None:
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(MAIN_MODELS))
    if unknown:
        raise SystemExit(f"unknown models {unknown}; valid: {', '.join(MAIN_MODELS)}")
    against = Path(args.against).resolve() if args.against else None
    reference = "neural_laplace" in models and reference_available()
    if "neural_laplace" in models and not reference:
        print(
            "reference package torchlaplace not installed (pip install '.[reference]'): Neural "
            "Laplace is timed against it only where it is",
            file=sys.stderr,
        )
    columns = _columns(against, reference)
    times: dict[str, dict[str, list[float]]] = {label: {} for label, _, _ in columns}
    breakdowns: dict[str, dict[str, float]] = {}
    for r in range(args.repeats):
        # alternate which column goes first, so that neither always meets the same load
        for label, tree, mode in columns if r % 2 == 0 else columns[::-1]:
            child = ["--child", ",".join(models), "--epochs", str(args.epochs)]
            if label == REFERENCE:
                child[1] = REFERENCE
            elif r == args.repeats - 1 and tree == _ROOT:
                child.append("--breakdown")
            got = _run_child(tree, mode, child)
            for name, s in got["epoch"].items():
                times[label].setdefault(name, []).append(s)
            if "breakdown" in got:
                breakdowns[mode] = got["breakdown"]
            print(f"# repeat {r + 1} {label}: done", file=sys.stderr, flush=True)
    print(
        f"\nCPU seconds per epoch (median of {args.repeats}; {args.epochs} epochs after one "
        f"untimed; {TRAJECTORIES} trajectories, batch {BATCH}, float64, one thread)"
    )
    head = f"{'model':16}" + "".join(f"{label:>22}" for label, _, _ in columns)
    print(head + f"{'portable / native':>19}" + (f"{'reference / portable':>22}" * reference))
    table = []
    for name in models:
        med = {
            label: statistics.median(times[label][name])
            for label, _, _ in columns
            if name in times[label]
        }
        ratio = med["portable"] / med["native"]
        row = [name, f"{med['native']:.3f}", f"{med['portable']:.3f}", f"{ratio:.2f}"]
        line = f"{name:16}" + "".join(f"{v:22.3f}" for v in med.values())
        line += " " * 22 * (len(columns) - len(med)) + f"{ratio:19.2f}"
        if reference:
            ref = med.get(REFERENCE)
            row += [f"{ref:.3f}", f"{ref / med['portable']:.2f}"] if ref else ["–", "–"]
            line += f"{ref / med['portable']:22.2f}" if ref else ""
        print(line)
        table.append(tuple(row))
    for mode in MODES:
        if mode in breakdowns:
            _print_breakdown(mode, breakdowns[mode])
    if args.record:
        from tasks.reports.measurements import record_measurement

        names: tuple[str, ...] = ("model", "native (s)", "portable (s)", "portable / native")
        if reference:
            names += ("reference (s)", "reference / portable")
        record_measurement(
            "portable_speed",
            "Training epoch in each CPU numerics mode, the paper's configuration",
            f"PYTHONPATH=. python benchmarks/portable_speed.py --repeats {args.repeats} "
            f"--epochs {args.epochs} --record",
            names,
            table,
            f"Median of {args.repeats}, the columns' children alternating; {TRAJECTORIES} "
            f"trajectories, batch {BATCH}, float64, one thread, process time"
            + (
                "; reference: the reference package's Neural Laplace (torchlaplace 0.0.4, "
                "its experiments' model at the paper's configuration) under torch's own kernels."
                if reference
                else "."
            ),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per model and child")
    parser.add_argument("--models", default=",".join(MAIN_MODELS), help="comma-separated")
    parser.add_argument("--against", default="", help="another checkout: its portable mode too")
    parser.add_argument("--record", action="store_true", help="write results/measurements/")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--breakdown", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1 or args.epochs < 1:
        parser.error("--repeats and --epochs must be at least 1")
    if not args.child:
        measure(args)
        return
    import nlmodels

    nlmodels.set_up_numerics()  # as every entry point does, before torch computes
    if args.child == REFERENCE:
        print(json.dumps(_reference_child(args.epochs)))
        return
    print(json.dumps(_child(args.child.split(","), args.epochs, args.breakdown)))


if __name__ == "__main__":
    main()
