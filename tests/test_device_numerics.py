"""Where a cell computed is part of its numerics: a GPU's run is never reused as a CPU cell's
result (nor the other way round), and the ledger reports a GPU's record as such."""

from __future__ import annotations

import pytest
import torch
from cells import ledger_record

from nltrain.numerics import FINGERPRINT_FORMAT
from tasks.ledger import computed_on_gpu, numerics_of
from tasks.ledger.scope import scope_of
from tasks.ledger.views import cell_states, ledger_status, ledger_table
from tasks.machine import numerics
from tasks.tracking import RunTags

GPU = "cuda: NVIDIA H200; torch 2.13.0+cu130; CUDA 13.0"


def _today(devices: frozenset[str]) -> tuple[object, numerics.CellNumerics]:
    from tasks.config import CellConfig

    cell = CellConfig(system="integro_de", method="node", seed=0)
    key, skey = numerics.model_key(cell), numerics.system_key(cell)
    return cell, numerics.CellNumerics({key: "m"}, {skey: "s"}, devices)


def _tags(**more: str) -> dict[str, str]:
    return {
        RunTags.NUMERICS_MODEL: "m",
        RunTags.NUMERICS_SYSTEM: "s",
        RunTags.NUMERICS_FORMAT: FINGERPRINT_FORMAT,
        **more,
    }


def test_a_gpu_run_is_not_a_cpu_cells_result_nor_the_other_way_round():
    cell, cpu = _today(frozenset({numerics.CPU}))
    assert numerics.agrees(cell, _tags(), cpu)  # a run from before the tag: the CPU's
    assert numerics.agrees(cell, _tags(**{RunTags.NUMERICS_DEVICE: "cpu"}), cpu)
    gpu_run = _tags(**{RunTags.NUMERICS_DEVICE: GPU})
    assert not numerics.agrees(cell, gpu_run, cpu)
    _, on_gpu = _today(frozenset({GPU}))
    assert numerics.agrees(cell, gpu_run, on_gpu)
    assert not numerics.agrees(cell, _tags(), on_gpu)
    # another GPU, or this one under another torch or CUDA, is another computation
    other = GPU.replace("H200", "A100")
    assert not numerics.agrees(cell, _tags(**{RunTags.NUMERICS_DEVICE: other}), on_gpu)


def test_the_reason_a_gpu_run_is_trained_again_here_names_its_device():
    from tasks.tracking import RunRecord

    cell, cpu = _today(frozenset({numerics.CPU}))
    record = RunRecord("r" * 32, cell.config_hash(), 0.1, _tags(**{RunTags.NUMERICS_DEVICE: GPU}))
    hashes, lines = numerics.stale([cell], {cell.config_hash(): record}, cpu)
    assert hashes == {cell.config_hash()}
    assert any(f"trained on another device ({GPU})" in line for line in lines)


def test_the_devices_a_cell_may_reuse_are_those_it_may_train_on_here():
    assert numerics.accepted_devices("cpu") == {numerics.CPU}
    if torch.cuda.is_available():
        pytest.skip("the CPU-only answers")
    assert numerics.accepted_devices("auto") == {numerics.CPU}
    assert numerics.accepted_devices("cuda") == frozenset()  # nothing here is a GPU's
    assert numerics.device_identity("cpu") == "cpu"


def test_a_gpu_identity_names_the_gpu_and_its_libraries(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    identity = numerics.device_identity("cuda:0")
    assert identity == f"cuda: NVIDIA H200; torch {torch.__version__}; CUDA 13.0"
    assert numerics.accepted_devices("auto") == {numerics.CPU, identity}
    assert numerics.accepted_devices("cuda") == {identity}


@pytest.mark.gpu
def test_on_a_gpu_its_identity_is_its_own():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    identity = numerics.device_identity("cuda")
    assert torch.cuda.get_device_name() in identity and identity != numerics.CPU


def test_the_ledger_counts_a_gpu_record_and_says_it_is_one():
    assert numerics_of("m", "s") == "m/s" == numerics_of("m", "s", "cpu")
    assert numerics_of("m", "s", GPU) == f"m/s@{GPU}" and computed_on_gpu(f"m/s@{GPU}")
    assert numerics_of(None, "s", GPU) is None
    scope = scope_of(methods=["node"], numerics=lambda cell: "today")
    cells = scope.select(["integro_de"], ["node"], [0, 1], ablations=False)
    records = [
        ledger_record("integro_de", "node", 0, config_hash=cells[0].config_hash),
        ledger_record(
            "integro_de", "node", 1, config_hash=cells[1].config_hash, numerics=f"today@{GPU}"
        ),
    ]
    states = {s.cell.seed: s for s in cell_states(records, cells)}
    assert (states[0].numerics, states[1].numerics) == ("today", "gpu")
    status = ledger_status(records, cells)
    assert len(status.counted()) == 2  # counted in the mean and the verdict
    _, table = ledger_table(status)
    from tasks.reports.tables import render_table

    assert "(n=2; 1 on GPU)" in render_table(table, "markdown")
