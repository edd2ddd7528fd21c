"""A CPU training step reuses the memory the step before it freed
(``nltrain._training._keep_freed_memory``): glibc's allocator would otherwise give the heap's
top back to the system after every step (``mallopt(3)``, ``M_TRIM_THRESHOLD``), and the next
step's tensors would start on fresh pages, each a page fault the kernel zeroes."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from datasets import load_or_simulate, prepare
from nlmodels import build_model
from nltrain import seeded, step_function
from tasks.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]

#: Minor page faults of five steps' worth of allocations (four 10 MB tensors made and freed),
#: after one such step, in a fresh process; argv[1] ``kept`` keeps freed memory first.
_STEPS = """
import resource, sys, torch
if sys.argv[1] == "kept":
    from nltrain._training import _keep_freed_memory
    _keep_freed_memory()
def step():
    tensors = [torch.ones(1_250_000, dtype=torch.float64) for _ in range(4)]
    del tensors
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _STEPS, mode],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


@pytest.mark.heavy  # counts page faults over many steps
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_kept_memory_spares_the_steps_their_page_faults():
    default, kept = _faults("default"), _faults("kept")
    # five steps of 40 MB are some 50 000 pages: by default a large share of them fault again
    # (how many depends on glibc's sliding mmap threshold and the kernel, so only the order of
    # magnitude is asserted here; the claim under test is the ratio below)
    assert default > 10_000, default
    assert kept * 4 < default, (kept, default)


def test_a_cpu_step_function_keeps_freed_memory(monkeypatch):
    import nltrain._training as training

    calls = []
    monkeypatch.setattr(training, "_keep_freed_memory", lambda: calls.append("kept"))
    data = prepare(load_or_simulate("integro_de", n_trajectories=20, seed=0), seed=0)
    with seeded(0):
        model = build_model("node", 1, hidden=(4,))
    config = TrainConfig(epochs=1, batch_size=8)
    step_function(model, data.train, data.val, config, device="cpu", step="eager")
    assert calls == ["kept"]
    if torch.cuda.is_available():
        step_function(model, data.train, data.val, config, device="cuda", step="eager")
        assert calls == ["kept"]
