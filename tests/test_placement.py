"""Placement: the probe cache under concurrent writers, choices from the step a pack really runs
(fake timings), GPU pack sizes, and the GPU lanes beside the CPU workers."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from cells import tiny_cell
from terminal import takes_ctrl_c

from tasks.engine import in_lanes, make_packs, plan_packs
from tasks.machine.placement import (
    CpuProbesAhead,
    Probe,
    cached_probe,
    gpu_pack_size,
    place_pack,
    probe_pack,
    split_evenly,
)

ROOT = Path(__file__).resolve().parents[1]


_cell = tiny_cell


@pytest.mark.heavy  # concurrent prober processes
def test_the_cache_keeps_every_entry_under_concurrent_writers(tmp_path):
    # Each process probes its own kinds of pack (slowly, so that the writes overlap); with a
    # read-modify-write that is not locked and merged, processes overwrite each other's entries.
    script = textwrap.dedent(
        """
        import sys, time, torch
        from tasks.config import CellConfig, TrainConfig
        from tasks.machine.placement import Probe, cached_probe
        proc, start = int(sys.argv[1]), float(sys.argv[2])
        def measure(cell, device, members):
            time.sleep(0.05)
            return Probe(proc + members / 100, 1000 * members)
        cell = CellConfig.model_validate({"system": "integro_de", "method": "node", "seed": 0,
            "data": {"n_trajectories": 30}, "training": TrainConfig(batch_size=8)})
        while time.time() < start:
            time.sleep(0.01)
        for members in range(1, 5):
            cached_probe(cell.model_copy(update={"method": ["node", "anode"][proc % 2]}),
                         members + 10 * proc, cache_dir=sys.argv[3], measure=measure)
        """
    )
    n_proc = 4
    start = time.time() + 6.0  # after every interpreter has imported torch
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(p), str(start), str(tmp_path)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for p in range(n_proc)
    ]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    cache = json.loads((tmp_path / "placement.json").read_text())
    assert len(cache) == n_proc * 4
    for entry in cache.values():
        assert set(entry) == {"cpu", "cuda", "cpu_bytes", "cuda_bytes"}
    members = sorted(int(k.rsplit("/x", 1)[1]) for k in cache)
    assert members == sorted(m + 10 * p for p in range(n_proc) for m in range(1, 5))


def test_placement_chooses_from_the_pack_it_will_run(tmp_path):
    # The GPU loses for one cell alone and wins for a pack of five: each pack is timed as it runs.
    seen: list[tuple[str, int]] = []

    def measure(cell, device, members):
        seen.append((device.type, members))
        return {"cpu": 1.0, "cuda": 2.0 / members}[device.type]

    kw = {"cache_dir": tmp_path, "measure": measure, "cuda_available": True}
    assert place_pack([_cell(0)], "auto", **kw).type == "cpu"
    assert place_pack([_cell(s) for s in range(5)], "auto", **kw).type == "cuda"
    assert sorted(seen) == [("cpu", 1), ("cpu", 5), ("cuda", 1), ("cuda", 5)]
    # Cached: the same kinds are not measured again, other seeds included.
    assert place_pack([_cell(s) for s in range(5, 10)], "auto", **kw).type == "cuda"
    assert len(seen) == 4


def test_without_cuda_nothing_is_measured_and_packs_are_the_configured_ones(tmp_path):
    def never(cell, device, members):
        raise AssertionError("measured on a machine without CUDA")

    cells = [_cell(s, method=m) for m in ("node", "neural_laplace") for s in range(4)]
    for device in ("auto", "cpu"):
        planned = plan_packs(
            cells, pack=True, device=device, cache_dir=tmp_path, measure=never,
            cuda_available=False,
        )  # fmt: skip
        assert [p for p, _ in planned] == make_packs(cells, pack=True)
        assert {d for _, d in planned} == {"cpu"}
    assert not (tmp_path / "placement.json").exists()


def test_neural_laplace_packs_where_placed_on_cuda_and_spreads_one_by_one_on_the_cpu(tmp_path):
    cells = [_cell(s, method="neural_laplace") for s in range(6)]
    kw = {"pack": True, "device": "auto", "cuda_available": True, "free_bytes": 64 * 2**30}

    def measure_with(cpu, cuda):
        def measure(cell, device, members):
            return Probe({"cpu": cpu, "cuda": cuda / members}[device.type], 2**20)

        return measure

    on_gpu = plan_packs(cells, cache_dir=tmp_path / "a", measure=measure_with(1.0, 1.0), **kw)
    assert [(len(p), d) for p, d in on_gpu] == [(6, "cuda")]
    # The CPU measured faster: the cells train one by one there, one pack each (spread over
    # the workers), as the probe measured them (tests/test_placement: the probe's own path).
    on_cpu = plan_packs(cells, cache_dir=tmp_path / "b", measure=measure_with(0.01, 1.0), **kw)
    assert on_cpu == [([c], "cpu") for c in cells]


def test_the_probe_runs_what_the_cells_will_run(monkeypatch):
    import nltrain as packing

    seen: list[tuple[str, bool, int]] = []
    real = packing.train_packed

    def spy(models, *a, **kw):
        results = real(models, *a, **kw)
        seen.append((type(models[0]).__name__, kw["pack"], results[0].packed_members))
        return results

    monkeypatch.setattr(packing, "train_packed", spy)
    cpu = torch.device("cpu")
    for method in ("neural_laplace", "node"):
        assert 0 < probe_pack(_cell(0, method=method), cpu, 2).seconds < 60
    # Neural Laplace on the CPU: one by one on its native kernels (what its cells run there);
    # the NODE packed.
    assert seen == [("NeuralLaplace", False, 1), ("NODE", True, 2)]


def test_gpu_pack_size_follows_memory_and_measured_throughput(tmp_path):
    gib = 2**30

    def measure_with(cost):
        def measure(cell, device, members):
            return Probe(cost(members), gib)  # one GiB a member

        return measure

    bigger_is_cheaper = measure_with(lambda m: 1.0 / m)
    kw = {"cache_dir": tmp_path, "lanes": 2}
    # 40 GiB free, half of it for two lanes: 10 members a pack at most.
    size = gpu_pack_size(_cell(0), 30, free_bytes=40 * gib, measure=bigger_is_cheaper, **kw)
    assert size == 10
    # Plenty of memory: the whole group of 30 (capped at MAX_PACK_MEMBERS otherwise).
    size = gpu_pack_size(_cell(0), 30, free_bytes=400 * gib, measure=bigger_is_cheaper, **kw)
    assert size == 30
    # A GPU saturated beyond 15 members: the half-size pack is measured clearly cheaper.
    saturated = measure_with(lambda m: 1.0 / m if m <= 15 else 0.2)
    other = _cell(0, method="anode")  # not cached yet
    assert gpu_pack_size(other, 30, free_bytes=400 * gib, measure=saturated, **kw) == 15
    assert gpu_pack_size(_cell(0), 1, measure=saturated, **kw) == 1


def test_plan_packs_splits_groups_and_places_each_pack(tmp_path):
    def measure(cell, device, members):
        if cell.method == "anode":  # anode: the CPU wins at every size
            return Probe({"cpu": 0.1, "cuda": 1.0}[device.type], 2**30)
        return Probe({"cpu": 1.0, "cuda": 1.0 / members}[device.type], 2**30)

    cells = [_cell(s, method=m) for m in ("node", "anode") for s in range(12)]
    cells += [_cell(0, method="neural_laplace")]
    planned = plan_packs(
        cells, pack=True, device="auto", cache_dir=tmp_path, measure=measure,
        cuda_available=True, free_bytes=16 * 2**30, lanes=2,
    )  # fmt: skip
    # 16 GiB free, 8 for the packs of two lanes: 4 members of 1 GiB a pack.
    shape = [(p[0].method, len(p), d) for p, d in planned]
    assert shape[:3] == [("node", 4, "cuda")] * 3
    assert shape[3:6] == [("anode", 4, "cpu")] * 3
    assert shape[6][:2] == ("neural_laplace", 1)
    assert sorted(c.config_hash() for p, _ in planned for c in p) == sorted(
        c.config_hash() for c in cells
    )


def test_split_evenly():
    assert split_evenly(list(range(30)), 16) == [list(range(15)), list(range(15, 30))]
    assert [len(p) for p in split_evenly(list(range(7)), 3)] == [3, 2, 2]
    assert split_evenly([1, 2], 5) == [[1, 2]]
    with pytest.raises(ValueError, match="at least one"):
        split_evenly([1], 0)


def _lanes_peaks(packs: list, max_workers: int, oldest_first: bool) -> tuple[list, dict]:
    """Run :func:`in_lanes` on futures that end when it waits for one (its oldest running pack,
    or its newest): the packs it yields, and the most packs running at once (all of them, on
    CUDA, on CUDA while CPU packs still wait) and whether CUDA and CPU packs ran together.

    What runs at once is what ``in_lanes`` submitted and has not seen end: counted exactly,
    with no threads racing sleeps, whatever the machine's load."""
    n_cpu = sum(device == "cpu" for _, device in packs)
    devices = {id(pack): device for pack, device in packs}
    running: dict[Future, str] = {}
    peak = {"cuda": 0, "all": 0, "cuda_while_cpu_waits": 0, "overlap": False}
    cpu_submitted = 0

    def submit(pack: list) -> Future:
        nonlocal cpu_submitted
        device = devices[id(pack)]
        cpu_submitted += device == "cpu"
        future: Future = Future()
        running[future] = device
        cuda = sum(d == "cuda" for d in running.values())
        peak["cuda"], peak["all"] = max(peak["cuda"], cuda), max(peak["all"], len(running))
        if cpu_submitted < n_cpu:  # (once every CPU pack is submitted, the rule is lifted)
            peak["cuda_while_cpu_waits"] = max(peak["cuda_while_cpu_waits"], cuda)
        peak["overlap"] = peak["overlap"] or 0 < cuda < len(running)
        return future

    def first_done(futures: list[Future]) -> Future:
        assert set(futures) == set(running)  # it waits on every pack it has running
        future = futures[0] if oldest_first else futures[-1]
        del running[future]
        future.set_result(None)
        return future

    done = list(in_lanes(packs, submit, max_workers=max_workers, lanes=2, first_done=first_done))
    return done, peak


@pytest.mark.parametrize("oldest_first", [True, False], ids=["oldest-ends-first", "newest"])
def test_gpu_lanes_run_beside_the_cpu_workers(oldest_first):
    packs = [([_cell(s)], "cuda") for s in range(6)] + [([_cell(s)], "cpu") for s in range(6, 12)]
    done, peak = _lanes_peaks(packs, 4, oldest_first)
    assert sorted(p[0].seed for _, p in done) == list(range(12))
    assert peak["cuda"] <= 2 and peak["all"] <= 4
    assert peak["cuda"] == 2 and peak["overlap"]  # both lanes used, CPU packs alongside

    # One worker: one pack at a time; two workers: while CPU packs wait, one of the workers is
    # theirs (in_lanes' rule; once they are all submitted, CUDA packs may take both)
    for workers, most_gpu in ((1, 1), (2, 1)):
        done, peak = _lanes_peaks(packs, workers, oldest_first)
        assert sorted(p[0].seed for _, p in done) == list(range(12))
        assert peak["all"] == workers and peak["cuda_while_cpu_waits"] <= most_gpu


def test_probe_times_the_packed_step_on_the_cpu():
    one = probe_pack(_cell(0), torch.device("cpu"), 1)
    two = probe_pack(_cell(0), torch.device("cpu"), 2)
    assert 0 < one.seconds < 60 and 0 < two.seconds < 60
    assert one.bytes_per_member == two.bytes_per_member == 0  # memory is measured on CUDA


def test_cached_probe_measures_only_missing_devices(tmp_path):
    calls = []

    def measure(cell, device, members):
        calls.append(device.type)
        return 1.0

    cached_probe(_cell(0), 3, ("cuda",), cache_dir=tmp_path, measure=measure)
    got = cached_probe(_cell(0), 3, cache_dir=tmp_path, measure=measure)
    assert calls == ["cuda", "cpu"] and got["cpu"] == got["cuda"] == 1.0


@pytest.mark.parametrize(
    "text", ["[1, 2]", '{"k": [1]}', '{"k": 3}', '{"k": {"cpu": "fast"}}', '{"k": {"cpu": true}}']
)
def test_a_cache_of_another_shape_is_measured_again_and_rewritten(tmp_path, text):
    from tasks.machine.placement import _probe_key

    (tmp_path / "placement.json").write_text(text.replace('"k"', f'"{_probe_key(_cell(0), 3)}"'))
    calls = []

    def measure(cell, device, members):
        calls.append(device.type)
        return 2.0

    got = cached_probe(_cell(0), 3, ("cpu",), cache_dir=tmp_path, measure=measure)
    assert calls == ["cpu"] and got == {"cpu": 2.0}
    again = cached_probe(_cell(0), 3, ("cpu",), cache_dir=tmp_path, measure=measure)
    assert calls == ["cpu"] and again == {"cpu": 2.0}  # rewritten, read back


def _gpu_check_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_gpu_check_slice_stopped_at_its_cap_keeps_its_log_and_says_how_far_it_got(
    tmp_path, monkeypatch
):
    """The slice's command is stopped at the part's cap: its output (the engine's lines per
    finished cell, logged) is kept as slice.log and the summary counts the finished cells."""
    gpu_check = _gpu_check_script()
    log = "".join(
        f"12:00:0{i} | INFO | Flow run 'x' - cell {i}/180 spiral_dde/node/seed{i}: test RMSE 0.1\n"
        for i in (1, 2, 3)
    )
    monkeypatch.setattr(gpu_check, "_run", lambda cmd, cap, env=None: (None, log, cap))
    part, seconds = gpu_check.part_benchmark(True, 100.0, 16, [], tmp_path)
    assert (tmp_path / "slice.log").read_text() == log
    assert part.status == "timed out" and seconds is None
    assert "Stopped at the part's cap of 100 s with 3 of 180 cells finished" in part.body


@pytest.mark.heavy  # a whole gpu-check run
def test_gpu_check_smallest_writes_its_summary(tmp_path):
    import re

    gpu_check = _gpu_check_script()
    threads = torch.get_num_threads()
    try:
        assert gpu_check.main(["--smallest", "--out", str(tmp_path), "--workers", "2"]) == 0
    finally:
        torch.set_num_threads(threads)
    text = (tmp_path / "summary.md").read_text()
    for section in (
        "# GPU check",
        "## pytest -m gpu",
        "## Throughput (seconds per cell-epoch)",
        "## Neural Laplace beside torchlaplace",
        "## Paper profile slice",
        "## Projection: the full paper profile on this machine",
    ):
        assert section in text
    assert "Skipped: no CUDA device" in text or "passed" in text
    # Both timed models have a row with positive seconds per cell-epoch, eager and packed ×2.
    node = re.search(r"^\| node \| float64 \| cpu \| ([\d.]+) \| ([\d.]+) \|", text, re.M)
    assert node and float(node.group(1)) > 0 and float(node.group(2)) > 0
    # Neural Laplace packs (its plain formulas); the projection trains it one by one on the CPU.
    nl = re.search(r"^\| neural_laplace \| float64 \| cpu \| ([\d.]+) \| ([\d.]+) \|", text, re.M)
    assert nl and float(nl.group(1)) > 0 and float(nl.group(2)) > 0
    # The projection plans the 180 cells on the CPU and gives a finite wall time for the two
    # timed models; the four others are named as left out.
    assert "180 cells × 1000 epochs, 2 workers, no GPU" in text
    # (the paper profile's NODE trains through the adjoint, as the reference code: one by one)
    assert re.search(r"^\| node \| cpu \| 30 × 1 \| [\d.]+ \| measured \|", text, re.M)
    assert re.search(r"^\| neural_laplace \| cpu \| 30 × 1 \| [\d.]+ \| measured \|", text, re.M)
    hours = re.search(r"projected wall time ([\d.]+) h", text)
    assert hours and 0 < float(hours.group(1)) < 1e4
    assert "left out of these totals: anode, latent_ode, nf_coupling, nf_resnet" in text
    # The folder becomes measurement records that say what the summary says.
    from tasks.reports.measurements import read_measurement

    gpu_check.record(tmp_path, into=tmp_path / "records")
    parts = read_measurement(tmp_path / "records" / "gpu_check.json")
    for title, status, _seconds, _result in parts.rows:
        assert re.search(rf"^\| {re.escape(title)} \| {status} \|", text, re.M)
    throughput = read_measurement(tmp_path / "records" / "gpu_throughput.json")
    assert {r[0] for r in throughput.rows} == {"node", "neural_laplace"}
    for row in throughput.rows:
        assert f"| {' | '.join(row)} |" in text
    projected = read_measurement(tmp_path / "records" / "gpu_projection.json")
    assert f"projected wall time {hours.group(1)} h" in projected.note
    # A damaged or foreign folder is a usage error, not a traceback.
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "check.json").write_text("{")
    for folder in (tmp_path / "bad", tmp_path / "absent"):
        with pytest.raises(SystemExit) as stopped:
            gpu_check.main(["--record-from", str(folder)])
        assert stopped.value.code == 2


@pytest.mark.heavy  # a benchmark of planned packs
def test_the_engine_runs_gpu_planned_packs_in_lanes(mlflow_store, prefect_server, monkeypatch):
    # The engine's lane path end to end through Prefect's thread runner: packs planned "cuda"
    # (here by a stand-in planner: no GPU on this machine) go through ``in_lanes``; on a machine
    # without CUDA each still trains where ``place_pack`` puts it, the CPU, and every cell ends
    # with its result.
    import tasks.engine as engine
    from flows import run_benchmark
    from tasks.config import resolve_config

    real_plan, real_lanes = engine.plan_packs, engine.in_lanes
    lanes_seen: list[list[str]] = []

    def plan(cells, **kw):
        planned = real_plan(cells, **kw)
        return [(p, "cuda" if p[0].method == "node" else d) for p, d in planned]

    def lanes(packs, submit, max_workers, *a, **kw):
        lanes_seen.append([d for _, d in packs])
        return real_lanes(packs, submit, max_workers, *a, **kw)

    monkeypatch.setattr(engine, "plan_packs", plan)
    monkeypatch.setattr(engine, "in_lanes", lanes)
    config = resolve_config(
        "smoke",
        overrides={
            "systems": ["integro_de"],
            "methods": ["node", "neural_laplace"],
            "seeds": [0, 1],
            "progress": False,
            "max_workers": 3,
        },
    )
    summary = run_benchmark(config)
    assert lanes_seen == [["cuda", "cpu", "cpu"]]
    assert summary.count("finished") == 4 and summary.ok


def test_the_projection_plans_with_the_engine_and_schedules_gpu_and_cpu_together(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is a folder of scripts, not installed
    from benchmarks.throughput import Timing, lookup, project
    from tasks.config import resolve_config

    gib = 2**30
    rows = [
        Timing("node", "float64", "cuda", True, {1: 1.0, 5: 0.2, 30: 0.05}, {}, {30: gib}),
        Timing("node", "float64", "cpu", True, {1: 0.5}),
        Timing("neural_laplace", "float64", "cuda", False, {1: 0.4}),
        Timing("neural_laplace", "float64", "cpu", False, {1: 0.3}),
    ]
    assert lookup(rows, "node", "float64", "cuda", 30) == (0.05, "measured")
    s, how = lookup(rows, "node", "float64", "cuda", 10)
    assert 0.05 < s < 0.2 and how == "interpolated ×5–×30"
    assert lookup(rows, "node", "float64", "cpu", 5) == (0.5, "extrapolated from ×1")
    cells = resolve_config(
        "fair", overrides={"systems": ["integro_de"], "methods": ["node", "neural_laplace"]}
    ).cells()
    p = project(rows, cells=cells, epochs=10, workers=4, cuda=True, free_bytes=100 * gib)
    plan = sorted((c.method, c.device, c.members) for c in p.packs)
    # node: one pack of its five seeds on the GPU (0.2 < 0.5 s); NL one by one on the CPU.
    assert plan == [("neural_laplace", "cpu", 1)] * 5 + [("node", "cuda", 5)]
    assert p.gpu_seconds == pytest.approx(5 * 0.2 * 10)
    # five NL cells of 3 s on the 4 - 1 (lanes in use) = 3 CPU workers: 6 s on the busiest
    assert p.cpu_seconds == pytest.approx(2 * 0.3 * 10)
    assert p.wall_seconds == pytest.approx(10.0)
    # Without CUDA the same cells all go to the CPU, planned without measuring.
    q = project(rows, cells=cells, epochs=10, workers=4, cuda=False)
    assert {c.device for c in q.packs} == {"cpu"} and q.gpu_seconds == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_probe_runs_the_graphed_pack_and_measures_its_memory(tmp_path):
    cell = _cell(0, method="nf_coupling")
    one, five = (probe_pack(cell, torch.device("cuda"), m) for m in (1, 5))
    assert 0 < five.seconds < 60 and five.bytes_per_member > 0 and one.bytes_per_member > 0
    cells = [_cell(s, method=m) for m in ("node", "neural_laplace") for s in range(6)]
    planned = plan_packs(cells, pack=True, device="auto", cache_dir=tmp_path)
    assert {d for _, d in planned} <= {"cpu", "cuda"}
    assert sorted(c.seed for p, _ in planned for c in p) == sorted(c.seed for c in cells)
    # The engine and a worker agree: the worker's place_pack reads what the engine measured.
    for pack, device in planned:
        assert place_pack(pack, "auto", cache_dir=tmp_path).type == device


@pytest.mark.heavy  # plans a whole GPU window
def test_a_gpu_window_is_planned_by_the_ledgers_rules_from_a_checks_timings(tmp_path):
    """From the H200 check's committed timings and an empty ledger: node's 30 cells are two
    packs of 15 on CUDA (each about two minutes); 5 minutes record one pack, 9.5 minutes
    both, one after another (the fixed cost and margin counted for each)."""
    from benchmarks.gpu_window import plan_window
    from tasks.config import MAIN_SYSTEMS

    throughput = ROOT / "results" / "gpu" / "2026-11-27-h200-second" / "throughput.json"
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("")
    free = 140 * 2**30
    # the fair profile's NODE packs on either device (the paper profile's adjoint on CUDA only)
    first = {m: plan_window(throughput, m, ledger, free, profile="fair")[0] for m in (1, 5, 9.5)}
    assert first[1][:3] == ("node seeds 0,1,2,3,4 on " + ", ".join(MAIN_SYSTEMS), 0, 30)
    assert first[5][1:3] == (15, 30) and first[9.5][1:3] == (30, 30)
    assert first[9.5][3] == pytest.approx(2 * first[5][3])


def _never_on_the_cpu(real=None):
    """A probe for the planning process: the GPU side from ``real`` (or a stand-in timing of
    100 s per cell-epoch), the CPU side never (it is to be measured ahead, elsewhere)."""

    def measure(cell, device, members):
        if device.type == "cpu":
            raise AssertionError("a CPU probe ran in the planning process")
        return real(cell, device, members) if real else Probe(100.0, 1000 * members)

    return measure


@pytest.mark.heavy  # probe processes
def test_cpu_probes_measured_ahead_in_other_processes_join_the_cache(tmp_path):
    cells = [_cell(0), _cell(0, method="anode")]
    with CpuProbesAhead(tmp_path, processes=2) as ahead:
        for c in cells:
            ahead.submit(c, 2)
    for c in cells:  # found in the cache: measuring again would raise
        entry = cached_probe(c, 2, ("cpu",), cache_dir=tmp_path, measure=_never_on_the_cpu())
        assert 0 < entry["cpu"] < math.inf
    # a pack of another size was not measured
    with pytest.raises(AssertionError, match="planning process"):
        cached_probe(cells[0], 3, ("cpu",), cache_dir=tmp_path, measure=_never_on_the_cpu())


@pytest.fixture
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.heavy  # probe processes
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core besides the planning's")
def test_auto_planning_measures_the_cpu_side_of_every_pack_ahead(
    tmp_path, monkeypatch, one_torch_thread
):
    # The planning process's probe (the module's, which the spawned processes do not share)
    # only ever times the GPU, at a stand-in 100 s per cell-epoch: every pack still gets its
    # real, far cheaper CPU time, measured ahead (one thread each, on the cores the planning
    # leaves), and is placed there.
    import tasks.machine.placement as placement

    monkeypatch.setattr(placement, "probe_pack", _never_on_the_cpu())
    cells = [_cell(s) for s in range(3)] + [_cell(s, method="anode") for s in range(3)]
    placed = plan_packs(
        cells, pack=True, device="auto", cache_dir=tmp_path, cuda_available=True,
        free_bytes=2**30,
    )  # fmt: skip
    assert sorted((p[0].method, len(p), d) for p, d in placed) == [
        ("anode", 3, "cpu"),
        ("node", 3, "cpu"),
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_planning_on_cuda_probes_the_cpu_side_in_other_processes(tmp_path, monkeypatch):
    import tasks.machine.placement as placement

    monkeypatch.setattr(placement, "probe_pack", _never_on_the_cpu(probe_pack))
    cells = [_cell(s) for s in range(4)] + [_cell(s, method="nf_coupling") for s in range(4)]
    placed = plan_packs(cells, pack=True, device="auto", cache_dir=tmp_path)
    assert sorted(c.seed for p, _ in placed for c in p) == [0, 0, 1, 1, 2, 2, 3, 3]
    # every pack placed with a CPU time measured ahead (in this process it would have raised)
    entries = json.loads((tmp_path / "placement.json").read_text()).values()
    assert sum(0 < e.get("cpu", 0) < math.inf for e in entries) >= 2


#: A probe that measures until its process is stopped (torch computing all along, as a real
#: probe does), saying in a file beside it that it has started.
_ENDLESS_PROBE = """
from pathlib import Path

def measures_for_ever(cell, members):
    import torch
    (Path(__file__).parent / "measuring").touch()
    x = torch.randn(256, 256, dtype=torch.float64)
    while True:
        x = torch.tanh(x @ x / 256)
"""

_PROBING_WHEN_STOPPED = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import endless_probe
    import tasks.machine.placement as placement
    from tasks.config import resolve_config
    from tasks.machine.placement import CpuProbesAhead
    placement._cpu_probe_seconds = endless_probe.measures_for_ever  # what its process runs
    cell = next(c for c in resolve_config("paper").cells() if c.method == "latent_ode")
    with CpuProbesAhead(sys.argv[1], processes=1) as ahead:
        ahead.submit(cell, 64)
        while not (Path(sys.argv[1]) / "measuring").exists():  # its process is up, measuring
            time.sleep(0.05)
        print("waiting for the probe", flush=True)
    """
)


@pytest.mark.heavy  # Ctrl-C to probe processes
def test_ctrl_c_while_waiting_for_probes_ends_them_cleanly(tmp_path):
    """The probe processes end on the planning's Ctrl-C, releasing what they hold: no semaphore
    reported leaked by the resource tracker at exit.

    The probe never ends by itself, so the command ending at all shows that it was stopped, not
    waited for; a real probe's remaining seconds, against a bound of seconds, told that only
    as far as the machine's load left them apart (a loaded machine slows both)."""
    import signal

    (tmp_path / "endless_probe.py").write_text(_ENDLESS_PROBE)
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROBING_WHEN_STOPPED, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=takes_ctrl_c,
    )
    assert proc.stdout.readline().strip() == "waiting for the probe"
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)  # never, were the probe waited for
    assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT), err
    assert "KeyboardInterrupt" in err and "leaked semaphore" not in err, err
    assert (
        not (tmp_path / "placement.json").exists()
        or "cpu" not in (tmp_path / "placement.json").read_text()
    )  # nothing half-measured was cached
