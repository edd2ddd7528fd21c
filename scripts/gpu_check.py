"""``make gpu-check``: everything a short GPU window should answer, in one Markdown summary.

On a machine with CUDA, within ``--budget`` seconds (default 450: under 8 minutes on one H100
with 16 cores), one part after another, each with its own time cap:

1. ``pytest -m gpu`` (the CUDA-only tests);
2. the throughput table of ``benchmarks/throughput.py``: eager, packed ×5, CUDA graphs ×5 and
   ×30 for every model of the paper's table (the Latent ODE's captured on a fixed budget of
   solver iterations; NODE and ANODE as the paper profile builds them, through the adjoint,
   packed by ``nlmodels.baselines._euler.euler_adjoint``), float64 (the paper's dtype:
   float32 is ``benchmarks/throughput.py --dtypes float32``, left out so that the slice below
   has the time it needs), plus each model's eager epoch on one CPU thread;
3. Neural Laplace beside the reference ``torchlaplace`` on the GPU (when it is importable);
4. the slice's data simulated first, timed apart (``nllab simulate --profile paper``), then
   ``nllab benchmark --profile paper --device auto --epochs 20`` over the six systems with seed
   0 (36 cells: every model on every system, each kind of pack planned, probed on both devices,
   trained and tracked), in a fresh tracking home (the data cache is shared);
5. the projection of the full paper profile (1000 epochs) on this machine, planned by the
   engine on the measured table, and the same projection for the 20-epoch slice beside its
   measured wall time;

and writes ``summary.md`` in ``--out``. Without CUDA it runs the CPU parts, small (a CPU
throughput table on fewer trajectories, a paper-profile slice of one system, two models, two
seeds and one epoch, in threads), says which parts it skipped and why, and exits 0 when what
ran passed.
``--smallest`` (the default test suite) also skips the benchmark slice: seconds.

    PYTHONPATH=. python scripts/gpu_check.py --out gpu-check

It also writes ``check.json`` there; ``--record-from gpu-check`` (on any machine, e.g. after
copying the folder back from a GPU node) turns it into the committed measurement records
``results/measurements/gpu_{check,throughput,projection}.json`` that the docs render.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.throughput import (  # noqa: E402
    ADJOINT_MODELS,
    N_TRAIN,
    PROJECTION_COLUMNS,
    Timing,
    lookup,
    project,
    projection_markdown,
    projection_rows,
    projection_sentences,
    read_timings,
    table_columns,
    table_markdown,
    table_rows,
)
from tasks.config import MAIN_SYSTEMS, PAPER_METHODS, resolve_config  # noqa: E402

#: Seconds each part may take at most on a CUDA machine (the budget may cut them shorter).
CUDA_CAPS = {"pytest": 90, "throughput": 240, "reference": 40, "data": 120}
#: The same without CUDA (the benchmark slice gets what is left of the budget).
CPU_CAPS = {"pytest": 0, "throughput": 70, "reference": 40, "data": 60}


@dataclass
class Part:
    title: str
    status: str  # "passed", "failed", "skipped", "timed out"
    seconds: float
    body: str


def _run(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, str, float]:
    """(exit code or None on timeout, output, seconds); ``env`` entries of None are unset."""
    t0 = time.perf_counter()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    full = {**os.environ, "PYTHONPATH": path, **(env or {})}
    try:
        done = subprocess.run(
            cmd,
            cwd=ROOT,
            env={k: v for k, v in full.items() if v is not None},
            capture_output=True,
            text=True,
            timeout=max(timeout, 1),
        )
        return done.returncode, done.stdout + done.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = "".join(
            (x or b"").decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)
        )
        return None, out, time.perf_counter() - t0


def _tail(text: str, n: int = 25) -> str:
    return "```\n" + "\n".join(text.strip().splitlines()[-n:]) + "\n```"


def part_pytest(cuda: bool, cap: float) -> Part:
    if not cuda:
        return Part("pytest -m gpu", "skipped", 0.0, "Skipped: no CUDA device on this machine.")
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    rc, out, secs = _run(cmd, cap)
    if rc is None:
        body = f"Stopped after {cap:.0f} s.\n\n{_tail(out)}"
        return Part("pytest -m gpu", "timed out", secs, body)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    status = "passed" if rc == 0 else "failed"
    body = f"`{last.strip('= ')}`" + ("" if rc == 0 else "\n\n" + _tail(out, 40))
    return Part("pytest -m gpu", status, secs, body)


def part_throughput(cuda: bool, cap: float, out: Path, smallest: bool) -> tuple[Part, list[Timing]]:
    title = "Throughput (seconds per cell-epoch)"
    json_path = out / "throughput.json"
    cmd = [sys.executable, "benchmarks/throughput.py", "--json", str(json_path), "--epochs", "2"]
    if cuda:
        cmd += ["--device", "cuda", "--dtypes", "float64", "--members", "5"]
        cmd += ["--models", *PAPER_METHODS]  # the models the projection and the slice train
        cmd += ["--big-members", "30", "--paper-settings", *ADJOINT_MODELS]
        note = (
            "CUDA: eager, packed ×5 (eager steps), CUDA graphs ×5 and ×30; CPU eager, 1 thread. "
            "(paper): built as the paper profile builds it (NODE, ANODE: through the adjoint)."
        )
    elif smallest:
        cmd += ["--device", "cpu", "--models", "node", "neural_laplace", "--n-train", "16"]
        cmd += ["--members", "2"]
        note = "CPU only, smallest: two models, 16 training trajectories (scaled to 800)."
    else:
        cmd += ["--device", "cpu", "--n-train", "128", "--members", "5"]
        cmd += ["--models", *PAPER_METHODS]  # (their defaults: the adjoint's CPU step is slow)
        note = "CPU only (no CUDA): 128 training trajectories timed, scaled to 800."
    if smallest:  # in this process: seconds, no second interpreter to start
        from contextlib import redirect_stdout
        from io import StringIO

        from benchmarks.throughput import main as throughput

        t0, buf = time.perf_counter(), StringIO()
        with redirect_stdout(buf):
            throughput(cmd[2:])
        rc, text, secs = 0, buf.getvalue(), time.perf_counter() - t0
    else:
        rc, text, secs = _run(cmd, cap)
    if rc is None or rc != 0 or not json_path.exists():
        status = "timed out" if rc is None else "failed"
        return Part(title, status, secs, _tail(text, 40)), []
    rows = read_timings(json_path)
    members = 5 if "--members" in cmd and cmd[cmd.index("--members") + 1] == "5" else 2
    return Part(title, "passed", secs, note + "\n\n" + table_markdown(rows, members, 30)), rows


def part_reference(rows: list[Timing], cuda: bool, cap: float) -> Part:
    """Neural Laplace against ``torchlaplace``: the reference's own loop (Adam, clipping 1, a
    ``.item()`` per batch, as it trains) per epoch, beside our table's rows."""
    title = "Neural Laplace beside torchlaplace"
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from epoch_speed import Trainer, reference_model

    if reference_model() is None:
        return Part(title, "skipped", 0.0, "Skipped: `torchlaplace` is not importable here.")
    from nlmodels.diagnostics import trajectories

    device = torch.device("cuda" if cuda else "cpu")
    t0 = time.perf_counter()
    t, x = trajectories(N_TRAIN, seed=0)
    lines = [
        "| dtype | device | torchlaplace s/epoch | ours eager | ours best (pack) | eager ratio "
        "| best ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for dtype in ("float64",):  # the table's dtype
        if time.perf_counter() - t0 > cap:
            lines.append(f"| {dtype} | stopped: over {cap:.0f} s |  |  |  |  |  |")
            break
        dt = getattr(torch, dtype)
        ref = reference_model().to(device=device, dtype=dt)
        tr = Trainer(
            ref, lambda ot, ox, qt, r=ref: r(ox, ot, qt), t.to(device, dt), x.to(device, dt),
            128, 1, time.perf_counter,
        )  # fmt: skip
        tr.epoch()  # warm-up
        ref_s = statistics.median(tr.epoch() for _ in range(3))
        ours, _ = lookup(rows, "neural_laplace", dtype, device.type, 1)
        row = next((r for r in rows if (r.model, r.dtype, r.device) ==
                    ("neural_laplace", dtype, device.type)), None)  # fmt: skip
        best = min(row.seconds.values()) if row else float("nan")
        lines.append(
            f"| {dtype} | {device.type} | {ref_s:.4f} | {ours:.4f} | {best:.4f} "
            f"| {ref_s / ours:.2f}× | {ref_s / best:.2f}× |"
        )
    return Part(title, "passed", time.perf_counter() - t0, "\n".join(lines))


def _slice_args(cuda: bool) -> tuple[list[str], dict]:
    """The benchmark slice's command-line arguments and its config's overrides."""
    if cuda:  # one seed: the planning's probes on a fresh machine take as long for five
        args = ["--systems", *MAIN_SYSTEMS, "--seeds", "0", "--epochs", "20"]
        return args, {"systems": MAIN_SYSTEMS, "seeds": [0], "epochs": 20}
    args = ["--systems", "integro_de", "--methods", "node", "neural_laplace", "--seeds", "0", "1"]
    args += ["--epochs", "1"]
    return args, {
        "systems": ["integro_de"],
        "methods": ["node", "neural_laplace"],
        "seeds": [0, 1],
        "epochs": 1,
    }


def part_data(cuda: bool, cap: float) -> Part:
    """The slice's data simulated (or read from the cache) first, on its own clock, so that the
    slice's wall time is training, probes and tracking, not a fresh machine's first simulation."""
    title = "Paper profile data: `nllab simulate --profile paper`"
    _, over = _slice_args(cuda)
    keep = ["--systems", *over["systems"], "--seeds", *(str(seed) for seed in over["seeds"])]
    cmd = [sys.executable, "-m", "flows.cli", "simulate", "--profile", "paper", *keep]
    rc, text, secs = _run(cmd, cap)
    shown = "nllab simulate --profile paper " + " ".join(keep)
    if rc is None:
        return Part(title, "timed out", secs, f"`{shown}` stopped at {cap:.0f} s.")
    if rc != 0:
        return Part(title, "failed", secs, f"`{shown}`\n\n{_tail(text, 30)}")
    return Part(title, "passed", secs, f"`{shown}`: {secs:.0f} s (the cache is kept).")


def part_benchmark(
    cuda: bool, cap: float, workers: int, rows: list[Timing], out: Path | None = None
) -> tuple[Part, float | None]:
    """The slice through the benchmark in a fresh home; its output kept as ``out/slice.log``,
    one line per finished cell (redirected output), so that a slice stopped at its cap still
    says how far it got."""
    title = "Paper profile slice: `nllab benchmark --profile paper --device auto`"
    args, over = _slice_args(cuda)
    real_home = Path(os.environ.get("NLLAB_HOME", Path.home() / ".nllab")).expanduser()
    with tempfile.TemporaryDirectory(prefix="nllab-gpu-check-") as tmp:
        home = Path(tmp)
        (real_home / "cache").mkdir(parents=True, exist_ok=True)
        (home / "cache").symlink_to(real_home / "cache")  # simulated data sets are reused
        config = home / "execution.json"
        execution = {"max_workers": workers, "torch_threads": 1}
        if not cuda:  # four small cells: worker processes would cost more than they train
            execution["isolation"] = "thread"
        config.write_text(json.dumps(execution))
        cmd = [sys.executable, "-m", "flows.cli", "benchmark", "--profile", "paper"]
        cmd += ["--device", "auto", "--config", str(config), *args]
        cmd += ["--no-register"]  # redirected: a line per finished cell, no bars
        env = {"NLLAB_HOME": str(home), "PREFECT_HOME": str(home / "prefect")}
        env["MLFLOW_TRACKING_URI"] = None  # the fresh home's embedded store
        rc, text, secs = _run(cmd, cap, env)
    if out is not None:
        (out / "slice.log").write_text(text)
    shown = "nllab benchmark --profile paper --device auto " + " ".join(args)
    body = [f"`{shown}` with {workers} workers, 1 torch thread each, fresh tracking store."]
    counts = re.search(r"^(\d+) cells: .*$", text, re.MULTILINE)
    if counts:
        body.append(f"`{counts.group(0)}`")
    body.append(f"Wall time {secs:.0f} s (Prefect start, data, placement probes included).")
    if rc is None:
        finished = re.findall(r"\bcell (\d+)/(\d+) ", text)
        got = f"{finished[-1][0]} of {finished[-1][1]}" if finished else "no"
        body.append(
            f"Stopped at the part's cap of {cap:.0f} s with {got} cells finished; a rerun "
            "resumes (cells reused)."
        )
    if rows:
        cells = resolve_config(
            "paper",
            overrides={
                **{k: v for k, v in over.items() if k != "epochs"},
                "training": {"epochs": over["epochs"]},
            },
        ).cells()
        free = torch.cuda.mem_get_info()[0] if cuda else None
        p = project(rows, cells=cells, epochs=over["epochs"], workers=workers, cuda=cuda,
                    free_bytes=free)  # fmt: skip
        flow = re.search(r"\((\d+) s in the flow\)", text)
        in_flow = float(flow.group(1)) if flow else secs
        body.append(
            f"Projected for this slice (training only): {p.wall_seconds:.0f} s; measured in the "
            f"flow {in_flow:.0f} s (data, probes, tracking included): measured / projected = "
            f"{in_flow / p.wall_seconds:.2f}."
            if p.wall_seconds
            else "No projection for this slice: none of its models was timed."
        )
    if rc not in (0, None):
        body.append(_tail(text, 40))
    status = "passed" if rc == 0 else "timed out" if rc is None else "failed"
    return Part(title, status, secs, "\n\n".join(body)), secs if rc == 0 else None


def _outcome(part: Part) -> str:
    """A part's result in one line: its first line that is not a code fence."""
    lines = [ln.strip() for ln in part.body.splitlines() if ln.strip() and ln.strip() != "```"]
    return (lines[0] if lines else part.status).replace("|", "/")


def record(folder: Path, into: Path | None = None) -> list[Path]:
    """Turn a finished check's folder (``check.json``, ``throughput.json``: what a GPU node's
    ``make gpu-check`` leaves in ``gpu-check/``) into committed measurement records:
    ``gpu_check`` (its parts), ``gpu_throughput`` and ``gpu_projection``, in ``into`` (default
    ``results/measurements``)."""
    from functools import partial

    from tasks.reports.measurements import FOLDER, record_measurement

    record_measurement = partial(record_measurement, folder=into or FOLDER)
    facts = json.loads((folder / "check.json").read_text())
    machine, command = facts["machine"], "make gpu-check"
    note = facts.get("note", "")
    paths = [
        record_measurement(
            "gpu_check", "The GPU check's parts", command,
            ("part", "status", "seconds", "result"), facts["parts"], note, machine=machine,
        )
    ]  # fmt: skip
    throughput = folder / "throughput.json"
    if throughput.exists():
        rows, cuda = read_timings(throughput), facts["cuda"]
        members = 5 if cuda else 2
        paths.append(
            record_measurement(
                "gpu_throughput", "Seconds per cell-epoch (800 training trajectories)",
                command, table_columns(members, 30), table_rows(rows, members, 30),
                machine=machine,
            )
        )  # fmt: skip
        p = project(rows, workers=facts["workers"], cuda=cuda, free_bytes=facts["free_bytes"])
        head, tail = projection_sentences(p)
        paths.append(
            record_measurement(
                "gpu_projection", "The full paper profile projected on this machine", command,
                PROJECTION_COLUMNS, projection_rows(p), f"{head} {tail}", machine=machine,
            )
        )  # fmt: skip
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu-check", help="folder of summary.md (default gpu-check)")
    ap.add_argument("--budget", type=float, help="seconds in all (default: CUDA 450, CPU 240)")
    ap.add_argument("--workers", type=int, help="workers (default: the CPU cores, at most 16)")
    ap.add_argument("--smallest", action="store_true", help="CPU only, seconds: no benchmark")
    ap.add_argument(
        "--record-from",
        metavar="DIR",
        type=Path,
        help="check nothing: record a finished check's folder (from a GPU node) as "
        "results/measurements/gpu_*.json, which the docs' generator renders",
    )
    args = ap.parse_args(argv)
    if args.record_from:
        if not (args.record_from / "check.json").is_file():
            ap.error(f"{args.record_from / 'check.json'} not found: not a finished check's folder")
        try:
            paths = record(args.record_from)
        except (ValueError, KeyError, TypeError) as error:  # JSONDecodeError is a ValueError
            ap.error(f"{args.record_from}: not a finished check's record ({error!r})")
        for path in paths:
            print(f"recorded: {path.relative_to(ROOT)}")
        return 0
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.smallest
    budget = args.budget or (450.0 if cuda else 240.0)
    workers = args.workers or min(os.cpu_count() or 1, 16)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    caps = CUDA_CAPS if cuda else CPU_CAPS

    def left(cap: float | None = None) -> float:
        rest = budget - (time.perf_counter() - t0)
        return max(1.0, rest if cap is None else min(cap, rest))

    parts = [part_pytest(cuda, left(caps["pytest"]))]
    tp, rows = part_throughput(cuda, left(caps["throughput"]), out, args.smallest)
    parts.append(tp)
    parts.append(part_reference(rows, cuda, left(caps["reference"])))
    if args.smallest:
        parts.append(Part("Paper profile slice", "skipped", 0.0, "Skipped: `--smallest`."))
    else:
        parts.append(part_data(cuda, left(caps["data"])))
        parts.append(part_benchmark(cuda, left(), workers, rows, out)[0])
    device = torch.cuda.get_device_name(0) if cuda else "none (CPU only)"
    head = [
        "# GPU check",
        "",
        f"Machine: {os.cpu_count()} CPU cores, GPU {device}, torch {torch.__version__}; "
        f"{workers} workers. Total {time.perf_counter() - t0:.0f} s of a {budget:.0f} s budget.",
        "",
        "| part | status | seconds |",
        "|---|---|---|",
        *[f"| {p.title} | {p.status} | {p.seconds:.0f} |" for p in parts],
    ]
    sections = [f"## {p.title}\n\n{p.body}" for p in parts]
    if rows:
        free = torch.cuda.mem_get_info()[0] if cuda else None
        full = project(rows, workers=workers, cuda=cuda, free_bytes=free)
        sections.append("## Projection: the full paper profile on this machine\n\n"
                        + projection_markdown(full))  # fmt: skip
    else:
        sections.append("## Projection\n\nNo projection: the throughput table did not finish.")
    text = "\n".join(head) + "\n\n" + "\n\n".join(sections) + "\n"
    (out / "summary.md").write_text(text)
    facts = {
        "machine": f"GPU {device}, {os.cpu_count()} CPU cores, torch {torch.__version__}",
        "workers": workers,
        "cuda": cuda,
        "free_bytes": torch.cuda.mem_get_info()[0] if cuda else None,
        "parts": [[p.title, p.status, f"{p.seconds:.0f}", _outcome(p)] for p in parts],
    }
    (out / "check.json").write_text(json.dumps(facts, indent=1) + "\n")
    print(text)
    print(f"written: {out / 'summary.md'}")
    return 0 if all(p.status in ("passed", "skipped") for p in parts) else 1


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    sys.exit(main())
