"""Which components' bytes depend on the CPU, and what the portable mode costs.

Different x86-64 CPUs run different code for the same arithmetic: numpy picks its float64 ``exp``
loop by instruction set (an AVX-512F one of its own, else the C library's), torch picks its CPU
kernels by ``ATEN_CPU_CAPABILITY`` (default, avx2, avx512), MKL its branch (``MKL_CBWR``) on Intel
CPUs and code of its own on others, OpenBLAS (scipy's and numpy's) its kernels per CPU model
(``OPENBLAS_CORETYPE``: Haswell, Zen, SkylakeX ...), and the native kernels are compiled for
``-march=native``. On one machine each choice can be forced, which reproduces what another CPU
computes (Intel, *oneMKL Developer Reference*, "Obtaining Numerically Reproducible Results";
PyTorch, ``aten/src/ATen/native/DispatchStub.cpp``; NumPy, "CPU build options / runtime
dispatch"; OpenBLAS, "Runtime CPU detection"). MKL's vendor check is forced by a shim preloaded
into the child (``LD_PRELOAD``), built here with the C compiler: its ``mkl_serv_intel_cpu_true``
answers "not Intel" and ``mkl_serv_cpuiszen`` "Zen", as on an AMD EPYC.

``findings`` (default) runs one child process per setting, in both CPU numerics modes
(``NLLAB_CPU_NUMERICS=native`` and ``portable``), and prints per component whether its bytes
differ from the mode's reference (no setting forced):

* ``data:<system>``: ``simulate(system, n_trajectories=200, seed=0).x`` (the quick data);
* ``split:<system>``: the system canary of :mod:`tasks.machine.numerics` (a small simulation with
  noise and its train/validation/test split and normaliser);
* ``model:<method>``: :func:`tasks.machine.numerics.training_digest` (two epochs of float64
  training, eager and packed, one thread: losses, weights, a forecast); Neural Laplace's runs
  the native kernels when they build.

``cost`` times CPU seconds per epoch (process time: on a shared machine wall time measures the
neighbours) of each model on the quick data size (200 trajectories, batch 32,
float64, one thread) in both modes, the modes' children alternating in the same run, and prints
the medians and the ratio portable / native.

    PYTHONPATH=. python benchmarks/cpu_numerics.py [findings|cost] [--repeats N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

#: (label, environment) of each forced setting; the empty one is each mode's reference.
SETTINGS: tuple[tuple[str, dict[str, str]], ...] = (
    ("reference", {}),
    ("ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"}),
    ("ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}),
    ("ATEN_CPU_CAPABILITY=avx512", {"ATEN_CPU_CAPABILITY": "avx512"}),
    ("MKL_CBWR=AVX2,STRICT", {"MKL_CBWR": "AVX2,STRICT"}),
    ("MKL_CBWR=AUTO", {"MKL_CBWR": "AUTO"}),
    ("ONEDNN_MAX_CPU_ISA=AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    ("NLLAB_NATIVE_MARCH=x86-64-v3", {"NLLAB_NATIVE_MARCH": "x86-64-v3"}),
    ("NLLAB_NATIVE_MARCH=x86-64-v4", {"NLLAB_NATIVE_MARCH": "x86-64-v4"}),
    ("NLLAB_NATIVE=0", {"NLLAB_NATIVE": "0"}),
    # the BLAS numpy and scipy bundle (OpenBLAS) picks its kernels per CPU model
    ("OPENBLAS_CORETYPE=Haswell", {"OPENBLAS_CORETYPE": "Haswell"}),
    ("OPENBLAS_CORETYPE=Zen", {"OPENBLAS_CORETYPE": "Zen"}),
    ("OPENBLAS_CORETYPE=SkylakeX", {"OPENBLAS_CORETYPE": "SkylakeX"}),
    ("OPENBLAS_CORETYPE=Prescott", {"OPENBLAS_CORETYPE": "Prescott"}),
    ("MKL as on an AMD CPU", {"LD_PRELOAD": "@mkl-amd"}),
    # numpy >= 2.3 names its AVX-512 group X86_V4 (older numpy: AVX512F AVX512_SKX ...)
    ("numpy without AVX-512", {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"}),
)
MODES = ("native", "portable")
SMOKE_METHODS = ("neural_laplace", "latent_ode", "node")
QUICK_N = 200


#: A stand-in for MKL's CPU vendor check on an AMD EPYC (Zen): preloaded, it answers for MKL.
MKL_AMD_SHIM = """
int mkl_serv_intel_cpu_true(void) { return 0; }
int mkl_serv_intel_cpu(void) { return 0; }
int mkl_serv_cpuiszen(void) { return 1; }
"""


def mkl_amd_shim(folder: Path) -> Path:
    """Build :data:`MKL_AMD_SHIM` into ``folder`` (``$CC``, else ``cc``); its path."""
    source, library = folder / "mkl_amd.c", folder / "mkl_amd.so"
    source.write_text(MKL_AMD_SHIM)
    compiler = os.environ.get("CC", "cc")
    command = [compiler, "-shared", "-fPIC", "-O2", str(source), "-o", str(library)]
    subprocess.run(command, check=True)
    return library


def _child_env(mode: str, extra: dict[str, str], scratch: Path) -> dict[str, str]:
    drop = ("ATEN_", "MKL_CBWR", "OPENBLAS_CORETYPE", "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    if extra.get("LD_PRELOAD") == "@mkl-amd":
        extra = {**extra, "LD_PRELOAD": str(mkl_amd_shim(scratch))}
    env.update(PYTHONPATH=str(_ROOT), NLLAB_CPU_NUMERICS=mode, **extra)
    env.setdefault("NLLAB_HOME", str(scratch / "home"))
    return env


def _run_child(args: list[str], mode: str, extra: dict[str, str]) -> dict:
    """Run this script with ``args`` in a child of CPU numerics ``mode`` and environment
    ``extra``, in a scratch home (unless ``NLLAB_HOME`` is set) removed after it."""
    with tempfile.TemporaryDirectory(prefix="nllab-cpu-numerics-") as scratch:
        env = _child_env(mode, extra, Path(scratch))
        out = subprocess.run(
            [sys.executable, __file__, *args], env=env, capture_output=True, text=True, check=False
        )
    if out.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- children -----------------------------------------------------------------------------------
def _digests() -> dict[str, str]:
    import torch

    from datasets import simulate
    from nlmodels import MODELS, numerics_tag
    from nltrain.numerics import system_fingerprint, training_digest
    from tasks import MAIN_SYSTEMS

    out = {"numerics": numerics_tag(), "capability": torch.backends.cpu.get_cpu_capability()}
    for system in MAIN_SYSTEMS:
        x = simulate(system, n_trajectories=QUICK_N, seed=0, workers=1).x
        out[f"data:{system}"] = hashlib.sha256(x.tobytes()).hexdigest()[:16]
        out[f"split:{system}"] = system_fingerprint(system)
    for method in sorted(MODELS):
        out[f"model:{method}"] = training_digest(method)
    return out


def _epoch_seconds(epochs: int) -> dict[str, float]:
    import torch

    from datasets import prepare, simulate
    from nlmodels import MODELS, build_model
    from nltrain import TrainConfig, train_packed

    torch.set_num_threads(1)
    prepared = prepare(simulate("spiral_dde", n_trajectories=QUICK_N, seed=0, workers=1), seed=0)
    config = TrainConfig(epochs=epochs, patience=None, batch_size=32, lr=3e-3)
    out = {}
    warm_up = TrainConfig(epochs=1, patience=None, batch_size=32, lr=3e-3)
    for method in sorted(MODELS):
        torch.manual_seed(0)
        model = build_model(method, prepared.train.obs_x.shape[-1])
        # an untimed epoch first: loading the native kernels, first-call allocations
        for cfg in (warm_up, config):
            t0 = time.process_time()
            train_packed([model], [prepared.train], [prepared.val], cfg, device="cpu", seeds=[0])
        out[method] = (time.process_time() - t0) / epochs
    return out


def smoke_bits(methods: tuple[str, ...] = SMOKE_METHODS) -> dict[str, str]:
    """Smoke-profile-sized training (40 trajectories, 2 epochs, batch 16, float64) of each of
    ``methods`` on the spiral: the test RMSE's bits and a digest of the test forecast."""
    import numpy as np
    import torch

    from datasets import prepare, simulate
    from nlmodels import build_model
    from nltrain import TrainConfig, predict, seeded, train_packed

    torch.set_num_threads(1)
    test = prepare(simulate("spiral_dde", n_trajectories=40, seed=0, workers=1), seed=0)
    config = TrainConfig(epochs=2, patience=None, batch_size=16)
    out = {}
    for method in methods:
        with seeded(0):
            model = build_model(method, test.train.obs_x.shape[-1])
        torch.manual_seed(0)
        train_packed([model], [test.train], [test.val], config, device="cpu", seeds=[0])
        pred = np.asarray(predict(model, test.test))
        rmse = float(np.sqrt(np.mean((pred - test.test.target) ** 2)))
        out[method] = f"{rmse.hex()} {hashlib.sha256(pred.tobytes()).hexdigest()[:16]}"
    return out


# -- parents ------------------------------------------------------------------------------------
def findings(modes: tuple[str, ...] = MODES, record: bool = False) -> None:
    rows: dict[str, dict[str, dict[str, str]]] = {}
    for mode in modes:
        rows[mode] = {}
        for label, extra in SETTINGS:
            rows[mode][label] = _run_child(["--child-digests"], mode, extra)
            print(f"# {mode} {label}: {rows[mode][label]['numerics']}", file=sys.stderr)
    components = [
        k for k in rows[modes[0]]["reference"] if k.startswith(("data:", "split:", "model:"))
    ]
    table = []
    for label, _ in SETTINGS[1:]:
        row = [label]
        for mode in modes:
            got, ref = rows[mode][label], rows[mode]["reference"]
            row.append(", ".join(c for c in components if got[c] != ref[c]) or "–")
        table.append(row)
    print(f"\ncomponents whose bytes differ from each mode's reference ({', '.join(modes)})")
    for row in table:
        print(f"{row[0]:32} {' | '.join(row[1:])}")
    if record:
        from tasks.reports.measurements import record_measurement

        record_measurement(
            "cpu_numerics_findings",
            "which setting moves which component's bytes, per CPU numerics mode",
            f"PYTHONPATH=. python benchmarks/cpu_numerics.py findings --modes {','.join(modes)} "
            "--record",
            ("setting forced", *(f"changed ({m} mode)" for m in modes)),
            table,
            "data: the quick data of a system; split: its canary split and normaliser; model: a "
            "short training (nltrain.numerics.training_digest). Each setting in its own process.",
        )
    print(f"\nreference digests ({' | '.join(modes)}):")
    for c in components:
        print(f"  {c:32} {' | '.join(rows[m]['reference'][c] for m in modes)}")


def cost(repeats: int, epochs: int, record: bool = False) -> None:
    times: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    for _ in range(repeats):
        for mode in MODES:  # alternating, so a change in the machine's load hits both modes
            got = _run_child(["--child-cost", str(epochs)], mode, {})
            for method, s in got.items():
                times[mode].setdefault(method, []).append(s)
    print(
        f"CPU seconds per epoch (median of {repeats}; {epochs} epochs after one untimed, "
        "200 trajectories, batch 32, float64, one thread)"
    )
    print(f"{'model':16} {'native':>8} {'portable':>9} {'ratio':>6}")
    table = []
    for method in times["native"]:
        a = statistics.median(times["native"][method])
        b = statistics.median(times["portable"][method])
        print(f"{method:16} {a:8.3f} {b:9.3f} {b / a:6.2f}")
        table.append((method, f"{a:.3f}", f"{b:.3f}", f"{b / a:.2f}"))
    if record:
        from tasks.reports.measurements import record_measurement

        record_measurement(
            "cpu_numerics_cost",
            "CPU seconds per epoch in each CPU numerics mode",
            f"PYTHONPATH=. python benchmarks/cpu_numerics.py cost --repeats {repeats} "
            f"--epochs {epochs} --record",
            ("model", "native (s)", "portable (s)", "portable / native"),
            table,
            f"Median of {repeats}, the modes' children alternating; 200 trajectories, batch 32, "
            "float64, one thread, process time.",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", nargs="?", default="findings", choices=("findings", "cost"))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--record", action="store_true", help="write results/measurements/")
    parser.add_argument("--child-digests", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-cost", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child-training", nargs="+", default=(), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_digests or args.child_smoke or args.child_cost or args.child_training:
        import nlmodels

        nlmodels.set_up_numerics()  # as every entry point does, before torch computes
        if note := nlmodels.numerics_note():
            print(f"nllab: {note}", file=sys.stderr)
    if args.child_training:
        from nltrain.numerics import training_digest

        print(json.dumps({m: training_digest(m) for m in args.child_training}))
    elif args.child_digests:
        print(json.dumps(_digests()))
    elif args.child_smoke:
        print(json.dumps(smoke_bits()))
    elif args.child_cost:
        print(json.dumps(_epoch_seconds(args.child_cost)))
    elif args.what == "cost":
        cost(args.repeats, args.epochs, args.record)
    else:
        findings(tuple(args.modes.split(",")), args.record)


if __name__ == "__main__":
    main()
