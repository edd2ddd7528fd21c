"""Placement under ``--device auto`` as a whole plan: the packs' devices chosen so that the plan
finishes first (GPU packs add up, CPU packs spread over the workers), from the per-pack choice."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from cells import tiny_cell

from tasks.engine import plan_packs
from tasks.machine.balance import MIN_GAIN, PackOption, balance_devices, busy_seconds
from tasks.machine.placement import Probe

ROOT = Path(__file__).resolve().parents[1]


def _span(options, where, workers, lanes=2):
    items = []
    for o, d in zip(options, where, strict=True):
        items += [("cuda", o.cuda)] if d == "cuda" else [("cpu", s) for s in o.cpu]
    return max(busy_seconds(items, workers, lanes))


def _fastest(options):
    return ["cuda" if o.cuda < sum(o.cpu) else "cpu" for o in options]


def test_a_model_faster_per_cell_on_the_gpu_still_sends_a_pack_to_idle_cores():
    # Two packs of 15 cells, 13.5x cheaper per cell on the GPU (the Latent ODE's probes on an
    # H200 beside one of its cores), 16 workers: both on the GPU take 3000 s one after another;
    # one of them as 15 single cells on 15 free cores takes 1350 s beside the other's 1500 s.
    packs = [PackOption(0.1 * 15 * 1000, (1.35 * 1000,) * 15)] * 2
    where = balance_devices(packs, _fastest(packs), workers=16)
    assert sorted(where) == ["cpu", "cuda"]
    assert _span(packs, where, 16) == pytest.approx(1500)
    assert _span(packs, _fastest(packs), 16) == pytest.approx(3000)
    # On two workers the cores are no match: both stay on the GPU.
    assert balance_devices(packs, _fastest(packs), workers=2) == ["cuda", "cuda"]


def test_the_balanced_plan_is_never_longer_and_no_single_move_shortens_it():
    rng = random.Random(0)
    for _ in range(200):
        workers, lanes = rng.randint(1, 16), rng.randint(1, 3)
        options = []
        for _ in range(rng.randint(1, 12)):
            per_cell, members = rng.lognormvariate(0, 1.5), rng.randint(1, 15)
            split = rng.random() < 0.5
            cpu = (per_cell,) * members if split else (per_cell * members,)
            options.append(PackOption(rng.lognormvariate(0, 1.5) * members, cpu))
        start = _fastest(options)
        where = balance_devices(options, start, workers, lanes)
        span = _span(options, where, workers, lanes)
        assert span <= _span(options, start, workers, lanes)
        for i in range(len(where)):
            moved = [*where[:i], "cpu" if where[i] == "cuda" else "cuda", *where[i + 1 :]]
            assert _span(options, moved, workers, lanes) >= span * (1 - MIN_GAIN) - 1e-12


def test_auto_planning_given_the_workers_places_the_plan_not_the_pack(tmp_path):
    # Neural Laplace trains one by one on the CPU: its pack of six, measured 10 % cheaper per
    # cell on the GPU, is still faster as six single cells on eight workers.
    cells = [tiny_cell(s, method="neural_laplace") for s in range(6)]

    def measure(cell, device, members):
        return Probe({"cpu": 1.0, "cuda": 0.9}[device.type], 2**20)

    kw = {"pack": True, "device": "auto", "cuda_available": True, "free_bytes": 64 * 2**30}
    per_pack = plan_packs(cells, cache_dir=tmp_path, measure=measure, **kw)
    assert [(len(p), d) for p, d in per_pack] == [(6, "cuda")]
    whole = plan_packs(cells, cache_dir=tmp_path, measure=measure, workers=8, **kw)
    assert whole == [([c], "cpu") for c in cells]
    # on one worker the six cells would train one after another: the GPU pack stays
    one = plan_packs(cells, cache_dir=tmp_path, measure=measure, workers=1, **kw)
    assert [(len(p), d) for p, d in one] == [(6, "cuda")]


@pytest.mark.heavy  # the planning benchmark timed
@pytest.mark.skipif(torch.cuda.is_available(), reason="--fake-cuda is for machines without CUDA")
def test_the_planning_benchmark_times_both_ways_on_stand_in_gpu_probes(monkeypatch, capsys):
    import tasks.engine as engine
    import tasks.machine.placement as placement

    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is a folder of scripts
    monkeypatch.setattr(placement, "probe_pack", placement.probe_pack)  # restored afterwards
    monkeypatch.setattr(engine, "CpuProbesAhead", engine.CpuProbesAhead)
    from benchmarks.planning_probes import main

    # (the fair profile's NODE packs on either device; the paper profile's adjoint on CUDA only)
    argv = ["--fake-cuda", "--systems", "integro_de", "--methods", "node", "--seeds", "0", "1"]
    argv += ["--profile", "fair"]
    assert main([*argv, "--workers", "2", "--compare"]) == 0
    out = capsys.readouterr().out
    # ahead: no CPU probe in the planning process; the baseline: the pack's one CPU probe there
    assert "CPU probes ahead:\n  cuda: 0 probes in this process, 0.0 s\n  cpu: 0 probes" in out
    assert "  cpu: 1 probes in this process" in out
    assert "planning with the CPU probes ahead:" in out
