"""Reproduce the paper's ILT table (Neural Laplace, Table 12) and compare with the reference.

F(s) = s/(s² + 1) against x(t) = cos t on 999 points of (0, 10], 33 terms, float64, one torch
thread: RMSE and µs per time point (median over repeats of query + F + reconstruct) for every
algorithm, beside the paper's RMSE. Further transform pairs check accuracy more broadly, and
FSI's RMSE is printed for 17/33/65/129 terms.

    python benchmarks/ilt_table.py [--repeats 30] [--reference-python .venv-bench/bin/python]

With ``--reference-python`` the same inversions run through the reference package
``torchlaplace`` (0.0.4) in a subprocess of that interpreter (its own venv; it is never a
dependency of this project), and the ratios ours/reference are printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nlmodels.diagnostics import ILT_ORDER as ORDER
from nlmodels.diagnostics import ILT_PAIRS as PAIRS
from nlmodels.diagnostics import PAPER_ILT_RMSE as PAPER_RMSE
from nlmodels.diagnostics import ilt_accuracy as measure_ours
from nlmodels.diagnostics import rmse as _rmse
from nlmodels.ilt import ILT_ALGORITHMS, get_ilt

REFERENCE_CLASS = {
    "fourier": "Fourier",
    "dehoog": "DeHoog",
    "talbot": "FixedTablot",
    "stehfest": "Stehfest",
    "cme": "CME",
    "euler": "Euler",
}
REFERENCE_SCRIPT = textwrap.dedent(
    """
    import json, sys, time, statistics
    import torch
    torch.set_num_threads(1)
    from torchlaplace import inverse_laplace as il
    job = json.loads(sys.argv[1])
    out = {}
    for name, cls in job["classes"].items():
        for label, f_expr, x_expr, t_expr in job["pairs"]:
            t = eval(t_expr).double()
            F = eval("lambda s: " + f_expr)
            x = eval(x_expr)
            ilt = getattr(il, cls)(ilt_reconstruction_terms=job["terms"],
                                   torch_float_datatype=torch.float64,
                                   torch_complex_datatype=torch.complex128)
            try:
                est = ilt(F, t).real.double()
                rmse = float(torch.sqrt(torch.mean((est - x) ** 2)))
            except Exception as err:  # the reference fails on some inputs: report, go on
                out[name + "|" + label] = {"rmse": None, "error": repr(err)[:80]}
                continue
            times = []
            if label == job["pairs"][0][0]:
                for _ in range(job["repeats"]):
                    t0 = time.perf_counter(); ilt(F, t); times.append(time.perf_counter() - t0)
            us = statistics.median(times) / t.numel() * 1e6 if times else None
            out[name + "|" + label] = {"rmse": rmse, "us": us}
    print(json.dumps(out))
    """
)


def measure_reference(python: str, terms: int, repeats: int) -> dict[str, dict]:
    job = {"classes": REFERENCE_CLASS, "pairs": PAIRS, "terms": terms, "repeats": repeats}
    proc = subprocess.run(
        [python, "-c", REFERENCE_SCRIPT, json.dumps(job)],
        capture_output=True,
        text=True,
        check=True,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fmt(v: float | None, spec: str = ".4g") -> str:
    return "–" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", type=int, default=33)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--reference-python", default=None, help="interpreter with torchlaplace")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    assert set(ORDER) == set(ILT_ALGORITHMS)

    ours = measure_ours(args.terms, args.repeats)
    ref = (
        measure_reference(args.reference_python, args.terms, args.repeats)
        if args.reference_python
        else {}
    )
    first = PAIRS[0][0]
    print(f"Table 12: F(s) = {first} vs cos t, 999 points of (0, 10], {args.terms} terms, float64")
    head = f"{'algorithm':10} {'Q':>3} {'paper RMSE':>11} {'our RMSE':>11} {'our µs/pt':>10}"
    if ref:
        head += f" {'ref RMSE':>11} {'ref µs/pt':>10} {'RMSE ratio':>10} {'speed-up':>9}"
    print(head)
    for name in ORDER:
        o = ours[f"{name}|{first}"]
        line = (
            f"{name:10} {get_ilt(name, args.terms).n_query:>3} {_fmt(PAPER_RMSE[name]):>11}"
            f" {_fmt(o['rmse']):>11} {_fmt(o['us'], '.3f'):>10}"
        )
        if ref:
            r = ref[f"{name}|{first}"]
            ratio = o["rmse"] / r["rmse"] if r.get("rmse") else None
            speed = r["us"] / o["us"] if r.get("us") else None
            line += (
                f" {_fmt(r.get('rmse')):>11} {_fmt(r.get('us'), '.3f'):>10}"
                f" {_fmt(ratio, '.3g'):>10} {_fmt(speed, '.2f'):>9}"
            )
        print(line)

    print("\nRMSE on further transform pairs (ours" + (" / reference)" if ref else ")"))
    print(f"{'algorithm':10} " + " ".join(f"{p[0]:>21}" for p in PAIRS[1:]))
    for name in ORDER:
        cells = []
        for label, *_ in PAIRS[1:]:
            o = ours[f"{name}|{label}"]["rmse"]
            cell = _fmt(o, ".2e")
            if ref:
                cell += " / " + _fmt(ref[f"{name}|{label}"].get("rmse"), ".2e")
            cells.append(f"{cell:>21}")
        print(f"{name:10} " + " ".join(cells))

    t = torch.linspace(0, 10, 1000, dtype=torch.float64)[1:]
    by_terms = {
        n: _rmse(get_ilt("fourier", terms=n).invert(lambda s: s / (s**2 + 1), t), torch.cos(t))
        for n in (17, 33, 65, 129)
    }
    cos_pair = (lambda s: s / (s**2 + 1), t)
    gamma = {
        conv: _rmse(
            get_ilt("fourier", terms=args.terms, gamma_convention=conv).invert(*cos_pair),
            torch.cos(t),
        )
        for conv in ("reference", "paper")
    }
    print(
        "\nFSI RMSE on cos t by terms: " + ", ".join(f"{n} → {v:.4g}" for n, v in by_terms.items())
    )
    print(
        f"FSI γ at {args.terms} terms: reference γ = α − ln ε/(2T): {gamma['reference']:.4g}; "
        f"paper γ = α − ln ε/T: {gamma['paper']:.4g}"
    )


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
