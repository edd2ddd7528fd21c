"""The cell engine: packs, placement, and per-member failure isolation."""

from __future__ import annotations

import torch
from cells import tiny_cell

from tasks.cell import CellRuntime, pack_key, run_cell, run_pack
from tasks.config import TrainConfig
from tasks.engine import CPU_PACK_MEMBERS, make_packs
from tasks.machine.placement import choose_fastest, place_cell
from tasks.tracking import connect

_cell = tiny_cell


def test_pack_key_ignores_the_seed_and_systems_of_the_same_shapes():
    assert pack_key(_cell(0)) == pack_key(_cell(7))
    assert pack_key(_cell(0)) == pack_key(_cell(3, system="sine", data={"n_trajectories": 30}))
    assert pack_key(_cell(0)) == pack_key(_cell(0, data={"n_trajectories": 30, "noise_std": 0.1}))
    assert pack_key(_cell(0)) != pack_key(_cell(0, system="spiral_dde"))  # 2 dimensions, not 1
    assert pack_key(_cell(0)) != pack_key(_cell(0, data={"n_trajectories": 30, "n_points": 50}))
    assert pack_key(_cell(0)) != pack_key(_cell(0, method="anode"))
    assert pack_key(_cell(0)) != pack_key(_cell(0, model={"hidden": (16,)}))
    assert pack_key(_cell(0)) != pack_key(_cell(0, training=TrainConfig(epochs=3)))
    assert pack_key(_cell(0)) != pack_key(_cell(0, data={"n_trajectories": 31}))


def test_make_packs_groups_seeds_in_order():
    cells = [_cell(0), _cell(0, method="anode"), _cell(1), _cell(1, method="anode"), _cell(2)]
    packs = make_packs(cells, pack=True)
    assert [[c.seed for c in p] for p in packs] == [[0, 1, 2], [0, 1]]
    assert [p[0].method for p in packs] == ["node", "anode"]
    assert make_packs(cells, pack=False) == [[c] for c in cells]
    # Models that train one by one anyway spread over the workers, one cell per pack.
    nl = [_cell(s, method="neural_laplace") for s in range(3)]  # its native CPU kernels
    assert make_packs(nl, pack=True) == [[c] for c in nl]
    dopri = [_cell(s, model={"solver": "dopri5"}) for s in range(2)]
    assert make_packs(dopri, pack=True) == [[c] for c in dopri]
    # On CUDA Neural Laplace packs (its plain formulas, graph-captured).
    assert make_packs(nl, pack=True, device="cuda") == [nl]


def test_cpu_packs_are_capped_by_a_constant_not_by_the_machine():
    # Cross-system groups of one shape can be large; on the CPU they split into packs of at
    # most CPU_PACK_MEMBERS, whatever the worker count or CPU of the machine.
    cells = [_cell(s, system=sys) for sys in ("integro_de", "sine") for s in range(6)]
    assert len({pack_key(c) for c in cells}) == 1
    packs = make_packs(cells, pack=True)
    assert [len(p) for p in packs] == [4, 4, 4] and CPU_PACK_MEMBERS == 5
    assert [c for p in packs for c in p] == cells


def test_a_packability_memo_probes_each_model_and_settings_once(monkeypatch):
    """Planning every system's seeds one group at a time (as ``ledger status --time-left``
    does): the memo gives the packs of :func:`make_packs` alone, with one probe per method and
    state dimension instead of one per group."""
    import nltrain
    from tasks.config.declarations import system_info
    from tasks.engine import packability_memo
    from tasks.ledger import paper_config

    probes: list[str] = []
    probe = nltrain.packable

    def counted(model, device):
        probes.append(model.registry_name)
        return probe(model, device)

    monkeypatch.setattr(nltrain, "packable", counted)
    config = paper_config(methods=["nf_coupling", "neural_laplace"], seeds=[0, 1])
    groups = [[c for c in config.cells() if c.system == s] for s in config.systems]
    alone = [make_packs(g, True) for g in groups]
    assert len(probes) == 2 * len(groups)
    probes.clear()
    memo = packability_memo()
    assert [make_packs(g, True, packable=memo) for g in groups] == alone
    kinds = {(c.method, system_info(c.system, c.data).state_dim) for g in groups for c in g}
    assert len(probes) == len(kinds) < 2 * len(groups)
    assert any(len(p) > 1 for packs in alone for p in packs)  # (some packs to compare)


def test_auto_placement_follows_the_measurement(tmp_path):
    calls: list[str] = []

    def fake(times):
        def measure(cell, device, members):
            calls.append(device.type)
            return times[device.type]

        return measure

    cell = _cell(0)
    slow_gpu = fake({"cpu": 0.01, "cuda": 0.05})
    kw = {"cache_dir": tmp_path, "cuda_available": True}
    assert place_cell(cell, "auto", measure=slow_gpu, **kw).type == "cpu"
    assert sorted(calls) == ["cpu", "cuda"]
    # Cached per machine and cell kind: no second probe, even with other timings offered.
    assert place_cell(_cell(3), "auto", measure=fake({"cpu": 9.0, "cuda": 0.1}), **kw).type == "cpu"
    assert len(calls) == 2
    # Another kind of cell is probed on its own.
    other = _cell(0, method="anode")
    assert place_cell(other, "auto", measure=fake({"cpu": 0.5, "cuda": 0.1}), **kw).type == "cuda"
    assert len(calls) == 4
    # No CUDA: the CPU without probing; an explicit device is taken as asked.
    assert place_cell(other, "auto", cache_dir=tmp_path, cuda_available=False).type == "cpu"
    assert place_cell(other, "cpu", cache_dir=tmp_path).type == "cpu"
    assert len(calls) == 4
    assert choose_fastest({"cpu": 2.0, "cuda": 1.0}) == "cuda"


def test_a_failing_member_leaves_the_others_finished(mlflow_store, monkeypatch):
    import tasks.pipeline as pipeline

    real = pipeline.build_model

    def build(method, state_dim, **kw):
        if torch.initial_seed() == 1:  # the member of seed 1 cannot be built
            raise RuntimeError("no model for seed 1")
        return real(method, state_dim, **kw)

    monkeypatch.setattr(pipeline, "build_model", build)
    t = connect()
    rt = CellRuntime.for_store(t.store, parent_run_id=None, profile="smoke", device="cpu")
    cells = [_cell(0), _cell(1), _cell(2)]
    results = run_pack(cells, rt)
    assert [r.status for r in results] == ["finished", "failed", "finished"]
    assert "no model for seed 1" in results[1].error
    cell_runs = t.store.client.search_runs([t.experiment_id], "tags.`nllab.kind` = 'cell'")
    runs = {r.data.tags["seed"]: r for r in cell_runs}
    assert runs["1"].info.status == "FAILED" and "seed 1" in runs["1"].data.tags["error"]
    assert runs["0"].info.status == runs["2"].info.status == "FINISHED"
    assert runs["0"].data.tags["packed_members"] in ("1", "2")
    # The survivors equal their runs alone (the packing contract: 1e-8 in float64 on CPU).
    monkeypatch.setattr(pipeline, "build_model", real)
    for i in (0, 2):
        alone = run_cell(cells[i], rt)  # trained again, not reused
        assert abs(alone.test_rmse - results[i].test_rmse) <= 1e-8


def test_claims_keep_two_owners_from_training_one_cell(mlflow_store, monkeypatch):
    import threading

    import tasks.cell as cell_module
    from tasks.tracking import claim_owner

    monkeypatch.setattr(cell_module, "CLAIM_POLL_SECONDS", 0.05)
    t = connect()
    rt = CellRuntime.for_store(t.store, parent_run_id=None, profile="smoke", device="cpu")
    cell = _cell(4)
    h = cell.config_hash()
    other = claim_owner()
    assert t.claims.claim_cell(h, other)
    out: list = []
    waiter = threading.Thread(target=lambda: out.extend(run_pack([cell], rt)))
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive()  # waiting on the other owner's claim, training nothing
    assert not t.queries.finished_cells([h])
    # The other owner trains it (here: this test, under the same claim), then releases it.
    trained = run_cell(cell, rt)
    t.claims.release_cell(h, other)
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    (got,) = out
    assert got.status == "reused" and got.run_id == trained.run_id
    cell_runs = t.store.client.search_runs([t.experiment_id], "tags.`nllab.kind` = 'cell'")
    assert len(cell_runs) == 1  # trained once


def test_pack_labels_name_every_cell_of_a_pack():
    from tasks.prefect_tasks import pack_label

    assert pack_label([_cell(0)]) == "integro_de/node/seed0"
    assert pack_label([_cell(0), _cell(1)]) == "integro_de/node/seeds 0,1"
    mixed = [_cell(0), _cell(0, system="sine", data={"n_trajectories": 30})]
    assert pack_label(mixed) == "node: integro_de/seed0, sine/seed0"


def test_workers_share_the_cores_unless_told_their_threads(monkeypatch):
    # None: the cores shared by the workers (an OpenMP pool the size of the machine in each
    # worker spins against the others); an explicit count wins.
    import os
    from dataclasses import replace

    from tasks.tracking import TrackingSettings

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    rt = CellRuntime(TrackingSettings("sqlite:///unused.db", None, "x"), "0", None, "paper")
    assert replace(rt, max_workers=4).cpu_threads() == 4
    assert replace(rt, max_workers=3).cpu_threads() == 5
    assert replace(rt, max_workers=32).cpu_threads() == 1
    assert replace(rt, max_workers=4, torch_threads=7).cpu_threads() == 7


def test_a_pack_trains_at_its_workers_threads_and_gives_the_process_its_own_back(
    mlflow_store, monkeypatch
):
    """torch's thread count is the whole process's: a pack run in-process (a notebook, a
    test) trains at the runtime's count and leaves the caller's as it found it."""
    import tasks.pipeline as pipeline

    real, seen = pipeline.build_model, []

    def build(method, state_dim, **kw):
        seen.append(torch.get_num_threads())
        return real(method, state_dim, **kw)

    monkeypatch.setattr(pipeline, "build_model", build)
    own = torch.get_num_threads()
    t = connect()
    rt = CellRuntime.for_store(
        t.store, parent_run_id=None, profile="smoke", device="cpu", torch_threads=own + 1
    )
    try:
        results = run_pack([_cell(0)], rt)
        assert [r.status for r in results] == ["finished"] and seen == [own + 1]
        assert torch.get_num_threads() == own
    finally:
        torch.set_num_threads(own)
