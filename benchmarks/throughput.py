"""Training throughput per model, and the paper profile's wall time projected from it.

For each model and dtype, on data of the paper profile's shapes (800 training and 100 validation
trajectories of 2 dimensions, 100 observed and 100 predicted points, batch 128, Adam with
clipping at 1), it times, in seconds per cell-epoch,

* eager: ``nltrain.train`` of one cell;
* packed ×M: ``nltrain.train_packed`` of ``--members`` cells (seeds 0, 1, ...) as one
  batched model with eager steps (its time per cell-epoch is the pack's epoch over M);
* graphs ×M and ×B (CUDA only): the packed step replayed from a captured CUDA graph, for
  ``--members`` and ``--big-members`` cells (B = 30: every seed of one model over six systems);
* CPU eager (with ``--device cuda``): one cell on one CPU thread, float64, for the projection;

each model at its defaults, or as the paper profile builds it with ``--paper-settings MODEL...``
(its row then says ``(paper)``: NODE and ANODE through the adjoint, as the paper profile's cells
train);

all in the same process, and prints a Markdown table. Models that are not packable train one
by one in ``train_packed``: their packed time is eager's, shown as "not packable".

**The projection** plans the paper profile (180 cells = 6 systems × 6 models × 5 seeds) with the
engine's own planner (``tasks.engine.plan_packs``: its pack sizes, its placement, its GPU lanes)
fed with this table instead of its probes, then schedules the packs on this machine: the CUDA
packs one after another on the GPU (lanes overlap host work, not GPU throughput), the CPU packs
over the other ``--workers`` (longest first, one thread each, assumed not to slow each other),
and reports the later of the two to finish. A pack whose member count was timed uses its
measured seconds per cell-epoch; any other is interpolated between the nearest timed counts
(log-linear in members) or, beyond the largest, takes its per-cell cost (no further gain
assumed); every row says which. The table's 2-dimensional data stand for every system.
Simulation, Prefect and MLflow time are not included.

    PYTHONPATH=. python benchmarks/throughput.py --device cpu --epochs 2 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasets import SplitData
from nlmodels import build_model
from nlmodels.diagnostics import trajectories
from nltrain import packable, seeded, select_device, train, train_packed
from tasks.config import METHODS, CellConfig, TrainConfig, resolve_config
from tasks.machine.placement import Probe

PAPER_CELLS_PER_MODEL = 6 * 5  # systems × seeds
#: The models the paper profile trains through the adjoint (the reference protocol's NODE and
#: ANODE: Euler, ``odeint_adjoint`` with the semi-norm), a step of another kind than their
#: defaults' (back-propagation through the solve): ``--paper-settings`` times them so.
ADJOINT_MODELS = ("node", "anode")
N_TRAIN, N_VAL = 800, 100


def splits(n_train: int = N_TRAIN, n_val: int = N_VAL) -> tuple[SplitData, SplitData]:
    t, x = trajectories(n_train + n_val, seed=0)
    t, x = t.numpy(), x.numpy()
    half = t.shape[0] // 2

    return (
        SplitData.from_trajectories(t, x[:n_train], half),
        SplitData.from_trajectories(t, x[n_train:], half),
    )


def models(name: str, seeds: range, settings: dict | None = None):
    """Model ``name`` for the table's 2-D data, seeded with each of ``seeds``, built with
    ``settings`` (keywords; default: the model's defaults)."""
    out = []
    for s in seeds:
        with seeded(s):
            out.append(build_model(name, 2, **(settings or {})))
    return out


def per_epoch(history) -> float:
    # after the first epoch (allocations, graph capture) where there are several
    return statistics.median(r.seconds for r in (history[1:] or history))


@dataclass
class Timing:
    """Seconds per cell-epoch of one model, dtype and device, by pack size (members)."""

    model: str
    dtype: str
    device: str
    packable: bool
    seconds: dict[int, float] = field(default_factory=dict)  # the step the engine runs
    eager_packed: dict[int, float] = field(default_factory=dict)  # packs without graphs (CUDA)
    bytes_per_member: dict[int, int] = field(default_factory=dict)  # CUDA peak memory
    #: pack sizes whose seconds are projected, not measured (benchmarks/latent_ode_steps.py)
    projected: list[int] = field(default_factory=list)
    #: the keywords the model was built with (empty: its defaults; ``--paper-settings``: the
    #: paper profile's, e.g. NODE's adjoint)
    settings: dict = field(default_factory=dict)


def read_timings(path: Path) -> list[Timing]:
    """The timings of a ``--json`` file (``make gpu-check`` leaves one as
    ``gpu-check/throughput.json``)."""
    rows = []
    for d in json.loads(Path(path).read_text())["timings"]:
        for k in ("seconds", "eager_packed", "bytes_per_member"):
            d[k] = {int(m): v for m, v in d[k].items()}
        rows.append(Timing(**d))
    return rows


def packed_seconds(
    name, tr, va, cfg, device, members: int, graphs: bool | None, settings: dict | None = None
) -> tuple[float | None, int]:
    """Seconds per cell-epoch of ``members`` seeds packed (None: no graph was captured), and the
    peak CUDA memory per member (0 on the CPU); the models built with ``settings``."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    results = train_packed(
        models(name, range(members), settings),
        [tr] * members,
        [va] * members,
        cfg,
        device=device,
        seeds=list(range(members)),
        graphs=graphs,
    )
    peak = (torch.cuda.max_memory_allocated(device) - base) // members if cuda else 0
    if graphs is None and not results[0].graphs:
        return None, peak
    return per_epoch(results[0].history) / members, peak


def measure(
    names: Sequence[str],
    dtypes: Sequence[str],
    device: torch.device,
    *,
    epochs: int,
    members: int,
    big_members: int,
    n_train: int = N_TRAIN,
    cpu_eager: bool = False,
    settings: dict[str, dict] | None = None,
    log=print,
) -> list[Timing]:
    """The table's timings (see the module's docstring); ``settings``: the keywords some models
    are built with (by name; the others at their defaults)."""
    tr, va = splits(n_train)
    out: list[Timing] = []
    for dtype in dtypes:
        cfg = TrainConfig(epochs=epochs, patience=None, batch_size=128, dtype=dtype)
        for name in names:
            kw = (settings or {}).get(name, {})
            can_pack = packable(models(name, range(1), kw)[0], device)
            row = Timing(name, dtype, device.type, can_pack, settings=kw)
            (one,) = models(name, range(1), kw)
            # one cell on the module's eager step on the CPU (what packing is measured against;
            # train's default there is a pack of one, for bitwise results)
            step = "eager" if device.type == "cpu" else "auto"
            one_run = train(one, tr, va, cfg, device=device, seed=0, step=step)
            row.seconds[1] = per_epoch(one_run.history)
            if can_pack and device.type == "cpu":
                row.seconds[members] = packed_seconds(
                    name, tr, va, cfg, device, members, False, kw
                )[0]
            elif can_pack:
                row.eager_packed[members] = packed_seconds(
                    name, tr, va, cfg, device, members, False, kw
                )[0]
                for m in (members, big_members):
                    s, peak = packed_seconds(name, tr, va, cfg, device, m, None, kw)
                    if s is not None:
                        row.seconds[m], row.bytes_per_member[m] = s, peak
            out.append(row)
            log(f"  {name} {dtype} on {device.type}: {row.seconds} s/cell-epoch", flush=True)
            if cpu_eager and device.type == "cuda" and dtype == "float64":
                (one,) = models(name, range(1), kw)
                cpu = Timing(name, dtype, "cpu", can_pack, settings=kw)
                cpu.seconds[1] = per_epoch(train(one, tr, va, cfg, seed=0, step="eager").history)
                out.append(cpu)
                log(f"  {name} {dtype} on cpu: {cpu.seconds} s/cell-epoch", flush=True)
    return out


def _fastest(a: Timing, b: Timing) -> Timing:
    """``a`` with each timing the smaller of ``a``'s and ``b``'s."""

    def low(x: dict, y: dict) -> dict:
        return {m: min(x[m], y.get(m, x[m])) for m in x}

    return Timing(
        a.model,
        a.dtype,
        a.device,
        a.packable,
        low(a.seconds, b.seconds),
        low(a.eager_packed, b.eager_packed),
        {m: max(a.bytes_per_member[m], b.bytes_per_member.get(m, 0)) for m in a.bytes_per_member},
        settings=a.settings,
    )


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"


def table_columns(members: int, big_members: int) -> tuple[str, ...]:
    return ("model", "dtype", "device", "eager", f"packed ×{members}", f"graphs ×{members}",
            f"graphs ×{big_members}", "best vs eager")  # fmt: skip


def table_rows(rows: Sequence[Timing], members: int, big_members: int) -> list[tuple[str, ...]]:
    """The timings as table rows (seconds per cell-epoch), in :func:`table_columns`' order."""
    out = []
    for r in rows:
        eager = r.seconds[1]
        if r.device == "cuda":
            packed = r.eager_packed.get(members)
            g5, g30 = r.seconds.get(members), r.seconds.get(big_members)
        else:
            packed, g5, g30 = r.seconds.get(members), None, None
        packed_s = _fmt(packed) if r.packable else "not packable"
        best = min(r.seconds.values())
        name = f"{r.model} (paper)" if r.settings else r.model  # --paper-settings
        out.append((name, r.dtype, r.device, f"{eager:.4f}", packed_s, _fmt(g5), _fmt(g30),
                    f"{eager / best:.1f}×"))  # fmt: skip
    return out


def _markdown(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        f"| {' | '.join(columns)} |",
        f"|{'|'.join('---' for _ in columns)}|",
        *(f"| {' | '.join(r)} |" for r in rows),
    ]


def table_markdown(rows: Sequence[Timing], members: int, big_members: int) -> str:
    """The timings as one Markdown table (seconds per cell-epoch)."""
    columns = table_columns(members, big_members)
    return "\n".join(_markdown(columns, table_rows(rows, members, big_members)))


def lookup(rows: Sequence[Timing], method: str, dtype: str, device: str, members: int):
    """(seconds per cell-epoch, how it was obtained) of a pack of ``members`` cells, from the
    timings: measured, interpolated, or extrapolated (see the module's docstring)."""
    row = next((r for r in rows if (r.model, r.dtype, r.device) == (method, dtype, device)), None)
    if row is None:
        return math.inf, f"not measured on {device}"
    # a pack that cannot be graphed trains packed with eager steps: the engine's step there
    seconds = {**row.eager_packed, **row.seconds}
    points = sorted(seconds)
    if members in seconds:
        return seconds[members], _source("measured", row, members)
    below = [m for m in points if m < members]
    above = [m for m in points if m > members]
    if below and above:
        a, b = below[-1], above[0]
        w = (math.log(members) - math.log(a)) / (math.log(b) - math.log(a))
        s = math.exp((1 - w) * math.log(seconds[a]) + w * math.log(seconds[b]))
        return s, _source(f"interpolated ×{a}–×{b}", row, a, b)
    k = below[-1] if below else above[0]
    return seconds[k], _source(f"extrapolated from ×{k}", row, k)


def _source(how: str, row: Timing, *used: int) -> str:
    """``how``, or the projection it rests on where a timing used was projected."""
    if not set(used) & set(row.projected):
        return how
    return "projected" if how == "measured" else f"{how} (projected)"


def table_measure(rows: Sequence[Timing]):
    """A ``tasks.machine.placement`` measure that reads the timings instead of probing."""

    def measure_(cell: CellConfig, device: torch.device, members: int) -> Probe:
        s, _ = lookup(rows, cell.method, cell.training.dtype, device.type, members)
        row = next(
            (
                r
                for r in rows
                if (r.model, r.dtype, r.device) == (cell.method, cell.training.dtype, device.type)
            ),
            None,
        )
        peaks = row.bytes_per_member if row is not None else {}
        per_member = peaks[max(peaks)] if peaks else 0
        return Probe(s, per_member)

    return measure_


@dataclass(frozen=True)
class PackCost:
    method: str
    device: str
    members: int
    seconds_per_cell_epoch: float
    how: str


@dataclass(frozen=True)
class Projection:
    epochs: int
    workers: int
    lanes: int
    cells: int
    packs: tuple[PackCost, ...]
    gpu_seconds: float
    cpu_seconds: float
    #: models without timings on the device the plan put them on: left out of the totals
    missing: tuple[str, ...] = ()

    @property
    def wall_seconds(self) -> float:
        return max(self.gpu_seconds, self.cpu_seconds)


def project(
    rows: Sequence[Timing],
    *,
    cells: Sequence[CellConfig] | None = None,
    epochs: int = 1000,
    workers: int,
    lanes: int | None = None,
    cuda: bool,
    free_bytes: int | None = None,
) -> Projection:
    """The wall time of ``cells`` (default: the paper profile's 180) at ``epochs`` epochs a
    cell, planned by ``tasks.engine.plan_packs`` on the timings, on ``workers`` workers of which
    ``lanes`` may be GPU lanes (see the module's docstring)."""
    from tasks.engine import GPU_LANES, busy_seconds, plan_packs

    lanes = GPU_LANES if lanes is None else lanes
    if cells is None:
        cells = resolve_config("paper").cells()
    with tempfile.TemporaryDirectory(prefix="nllab-projection-") as tmp:  # not the real cache
        planned = plan_packs(
            cells,
            pack=True,
            device="auto",
            cache_dir=Path(tmp),
            lanes=lanes,
            workers=workers,
            measure=table_measure(rows),
            cuda_available=cuda,
            free_bytes=free_bytes,
        )
    costs = []
    for pack, device in planned:
        c = pack[0]
        s, how = lookup(rows, c.method, c.training.dtype, device, len(pack))
        costs.append(PackCost(c.method, device, len(pack), s, how))
    timed = [p for p in costs if math.isfinite(p.seconds_per_cell_epoch)]
    gpu, cpu = busy_seconds(
        ((p.device, p.seconds_per_cell_epoch * p.members * epochs) for p in timed), workers, lanes
    )
    return Projection(
        epochs,
        workers,
        lanes if cuda else 0,
        len(cells),
        tuple(costs),
        gpu,
        cpu,
        tuple(sorted({p.method for p in costs} - {p.method for p in timed})),
    )


PROJECTION_COLUMNS = ("model", "device", "packs × members", "s/cell-epoch", "source")


def projection_rows(p: Projection) -> list[tuple[str, ...]]:
    """The projection's plan per model, in :data:`PROJECTION_COLUMNS`' order."""
    by_model: dict[tuple[str, str], list[PackCost]] = {}
    for c in p.packs:
        by_model.setdefault((c.method, c.device), []).append(c)
    rows = []
    for (method, device), packs in by_model.items():
        sizes = sorted({c.members for c in packs})
        shape = ", ".join(f"{sum(c.members == m for c in packs)} × {m}" for m in sizes)
        secs = ", ".join(sorted({f"{c.seconds_per_cell_epoch:.4f}" for c in packs}))
        how = ", ".join(sorted({c.how for c in packs}))
        rows.append((method, device, shape, secs, how))
    return rows


def projection_sentences(p: Projection) -> tuple[str, str]:
    """(what was projected, what it came to): the text around :func:`projection_rows`."""
    lanes = f" (up to {p.lanes} of them GPU lanes)" if p.lanes else ", no GPU"
    head = (
        f"Paper profile: {p.cells} cells × {p.epochs} epochs, {p.workers} workers{lanes}, "
        "planned by `tasks.engine.plan_packs` on the timings above."
    )
    tail = (
        f"GPU busy {p.gpu_seconds / 3600:.2f} h, CPU workers busy {p.cpu_seconds / 3600:.2f} h: "
        f"**projected wall time {p.wall_seconds / 3600:.2f} h** "
        f"({p.wall_seconds:.0f} s; training only: simulation, Prefect and MLflow not included)."
    )
    if p.missing:
        tail += f" Not timed, so left out of these totals: {', '.join(p.missing)}."
    return head, tail


def projection_markdown(p: Projection) -> str:
    """The projection's plan per model and its wall time."""
    head, tail = projection_sentences(p)
    return "\n".join([head, "", *_markdown(PROJECTION_COLUMNS, projection_rows(p)), "", tail])


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--members", type=int, default=5)
    ap.add_argument("--big-members", type=int, default=30, help="the larger graphed pack (CUDA)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs timed per run (first: warm-up)")
    ap.add_argument("--dtypes", nargs="+", default=["float64"], choices=["float64", "float32"])
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="workers of the projection (default: the CPU cores, at most 16)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads (per worker)")
    ap.add_argument("--models", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument(
        "--paper-settings",
        nargs="+",
        default=[],
        choices=list(METHODS),
        metavar="MODEL",
        help="build these models as the paper profile does (e.g. node anode: the reference "
        "protocol's adjoint); the others at their defaults",
    )
    ap.add_argument("--n-train", type=int, default=N_TRAIN, help="training trajectories timed")
    ap.add_argument("--json", metavar="FILE", help="also write the timings and projection")
    ap.add_argument(
        "--repeats", type=int, default=1, help="measure the table this often; keep the fastest"
    )
    args = ap.parse_args(argv)
    if args.members < 2:
        ap.error("--members must be >= 2")
    torch.set_num_threads(args.threads)
    device = select_device(args.device)
    workers = args.workers or min(os.cpu_count() or 1, 16)
    print(
        f"device {device}, {args.threads} thread(s), {args.epochs} epochs a run, "
        f"{args.n_train} train / {N_VAL} val trajectories, 100 + 100 points, D = 2, batch 128, "
        f"{', '.join(args.dtypes)}, torch {torch.__version__}\n"
    )
    rows: list[Timing] = []
    for _ in range(args.repeats):  # whole tables in turn, so that a busy machine slows all alike
        again = measure(
            args.models,
            args.dtypes,
            device,
            epochs=args.epochs,
            members=args.members,
            big_members=args.big_members,
            n_train=args.n_train,
            cpu_eager=device.type == "cuda",
            settings={m: dict(resolve_config("paper").models[m]) for m in args.paper_settings},
        )
        rows = again if not rows else [_fastest(a, b) for a, b in zip(rows, again, strict=True)]
    if args.n_train != N_TRAIN:  # per cell-epoch of the paper's 800 trajectories
        # by batches; below one batch, by trajectories (a rough figure either way)
        scale = (
            math.ceil(N_TRAIN / 128) / math.ceil(args.n_train / 128)
            if args.n_train >= 128
            else N_TRAIN / args.n_train
        )
        for r in rows:
            r.seconds = {m: s * scale for m, s in r.seconds.items()}
            r.eager_packed = {m: s * scale for m, s in r.eager_packed.items()}
        print(f"\n(scaled ×{scale:.1f} from {args.n_train} to {N_TRAIN} training trajectories)")
    print()
    print(table_markdown(rows, args.members, args.big_members))
    cuda = device.type == "cuda"
    free = torch.cuda.mem_get_info()[0] if cuda else None
    proj = project(rows, workers=workers, cuda=cuda, free_bytes=free)
    print()
    print(projection_markdown(proj))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "timings": [asdict(r) for r in rows],
                    "projection": {**asdict(proj), "wall_seconds": proj.wall_seconds},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    from nlmodels import set_up_numerics

    set_up_numerics()  # before torch computes: the CPU numerics the training paths require
    main()
